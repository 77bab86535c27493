"""A pure-PyTorch rewrite (clamp instead of relu): accepted only with --allow-torch, and labelled so."""
import torch.nn as nn

EXPECT = None
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def forward(self, x):
        return x.clamp_min(0)
