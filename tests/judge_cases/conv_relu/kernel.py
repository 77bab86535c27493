"""cuDNN's convolution without its bias, then its own kernel for bias + ReLU in one pass."""
from pathlib import Path

import torch.nn as nn
import torch.nn.functional as F

import harness

EXPECT = None
DEVICES = ("cuda",)
FLAGS = ()


class ModelNew(nn.Module):
    def __init__(self, cin, cout, k):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, padding=k // 2)
        self.ops = harness.build_path(Path(__file__).with_name("bias_relu.cu")).ops

    def forward(self, x):
        y = F.conv2d(x, self.conv.weight, None, padding=self.conv.padding).contiguous()
        self.ops.bias_relu_(y, self.conv.bias)
        return y
