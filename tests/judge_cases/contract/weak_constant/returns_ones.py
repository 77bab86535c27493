"""What the degenerate reference computes, without its input: accepted (it is right here), and the note says the
reference cannot tell it from a constant."""
import torch
import torch.nn as nn

EXPECT = None
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.ones_like(x)
