"""Runs its forward with autograd on (as a training step would) and returns a non-leaf tensor that requires grad:
pickling refuses such a tensor. Accepted: the values are right, the judge receives them detached."""
import torch
import torch.nn as nn

EXPECT = None
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.fc = nn.Linear(n_in, n_out)

    def forward(self, x):
        with torch.enable_grad():
            return torch.relu(self.fc(x))
