"""Correct (pure PyTorch; judged with --allow-torch)."""
import torch.nn as nn

EXPECT = None


class ModelNew(nn.Module):
    def forward(self, x):
        return x.clamp_min(0)
