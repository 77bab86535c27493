"""Sum over dim 1 with its own kernel (sum_dim.cu, built through the playground's compile cache)."""
from pathlib import Path

import torch
import torch.nn as nn

import harness

EXPECT = None
DEVICES = ("cuda",)
FLAGS = ()


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        assert dim == 1
        self.ops = harness.build_path(Path(__file__).with_name("sum_dim.cu")).ops

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty(x.size(0), 1, x.size(2), device=x.device)
        self.ops.sum_mid_forward(x, y, False)
        return y
