"""Skips the last element of every sum (pure PyTorch, so CI sees the rejection on the CPU too)."""
import torch.nn as nn

EXPECT = r"trial 1 .*over budget"
KIND = "wrong_output"
DEVICES = ("cpu",)
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return x[:, :-1].sum(self.dim, keepdim=True)
