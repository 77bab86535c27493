"""The input returned as it is (a copy, so that the judge's input is not handed back): accepted, and the note says
the reference cannot tell a right kernel from its input passed through."""
import torch
import torch.nn as nn

EXPECT = None
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.register_buffer("shift", torch.zeros(dim))

    def forward(self, x):
        return x.clone()
