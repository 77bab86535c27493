"""A pure-PyTorch rewrite: the normalisation written out, statistics in float64."""
import torch
import torch.nn as nn

EXPECT = None
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.ln = nn.LayerNorm(features)

    def forward(self, x):
        xd = x.double()
        mean = xd.mean(-1, keepdim=True)
        var = xd.var(-1, unbiased=False, keepdim=True)
        return ((xd - mean) * torch.rsqrt(var + self.ln.eps) * self.ln.weight + self.ln.bias).float()
