"""A pure-PyTorch rewrite (sum as a batched matrix-vector product in float64)."""
import torch.nn as nn

EXPECT = None
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return x.double().sum(self.dim, keepdim=True).float()
