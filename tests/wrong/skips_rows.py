"""Computes every row but the last and leaves it unwritten (a tail bug, or a 'fast path' that skips work)."""
import torch
import torch.nn as nn

from harness import Kernel

PROBLEM = "softmax"
EXPECT = r"NaN/Inf positions differ"
KIND = "non_finite"
DEVICES = ("cuda",)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = Kernel("softmax", "6_regcluster")

    def forward(self, x):
        x = x if x.stride(1) == 1 else x.contiguous()
        y = torch.empty_like(x)
        if x.size(0) > 1:
            self.k.softmax_forward(x[:-1], y[:-1])
        return y
