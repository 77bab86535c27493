"""torch.prod itself: accepted (the overflowing derived input is skipped because PyTorch fp32 fails it too)."""
import torch.nn as nn

EXPECT = None
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def forward(self, x):
        return x.prod(1)
