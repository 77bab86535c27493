"""Correct, but no kernel of its own runs; without --allow-torch that is a rejection."""
import torch
import torch.nn as nn

EXPECT = r"own kernel: no kernel of the row's own ran"
KIND = "own_kernel"
DEVICES = ("cuda",)
FLAGS = ()


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x)
