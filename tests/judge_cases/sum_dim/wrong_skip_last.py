"""The same kernel with the last element of every sum skipped."""
from pathlib import Path

import torch
import torch.nn as nn

import harness

EXPECT = r"trial 1 .*over budget"
KIND = "wrong_output"
DEVICES = ("cuda",)
FLAGS = ()


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.ops = harness.build_path(Path(__file__).with_name("sum_dim.cu")).ops

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty(x.size(0), 1, x.size(2), device=x.device)
        self.ops.sum_mid_forward(x, y, True)
        return y
