"""A hand-written torch.autograd.Function: the forward and its derivative written out (dz = dy (1 - y^2),
dx = dz W, dW = dz^T x, db = sum dz). Accepted with --backward."""
import torch.nn as nn

from _fn import LinearTanh

EXPECT = None
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch", "--backward")


class ModelNew(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.fc = nn.Linear(n_in, n_out)

    def forward(self, x):
        return LinearTanh.apply(x, self.fc.weight, self.fc.bias)
