"""The layer written out with torch's functions; autograd derives the backward. Accepted with --backward."""
import torch
import torch.nn as nn

EXPECT = None
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch", "--backward")


class ModelNew(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.fc = nn.Linear(n_in, n_out)

    def forward(self, x):
        return torch.tanh(torch.addmm(self.fc.bias, x, self.fc.weight.t()))
