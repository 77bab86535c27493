"""Compiles its forward with torch.compile inside: torch installing its own wrappers is not the candidate patching
torch. Judged like any other."""
import torch
import torch.nn as nn

EXPECT = None
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)


def _f(x):
    return torch.nn.functional.gelu(x) * 0.5


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = torch.compile(_f)

    def forward(self, x):
        return self.f(x)
