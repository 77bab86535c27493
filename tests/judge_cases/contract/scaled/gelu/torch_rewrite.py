"""The erf GELU written out: accepted at the smaller shape on the CPU."""
import torch
import torch.nn as nn

EXPECT = None
DEVICES = ("cpu",)
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.erf(x * 0.7071067811865476))
