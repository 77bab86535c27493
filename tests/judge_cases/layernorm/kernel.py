"""LayerNorm with its own kernel, reading the current weight and bias on every call."""
from pathlib import Path

import torch
import torch.nn as nn

import harness

EXPECT = None
DEVICES = ("cuda",)
FLAGS = ()


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.ln = nn.LayerNorm(features)
        self.ops = harness.build_path(Path(__file__).with_name("layernorm.cu")).ops

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        self.ops.layernorm_forward(x, self.ln.weight, self.ln.bias, y, self.ln.eps)
        return y
