"""Reduction over one dimension: sum over dim 1 of a 3-D tensor, keepdim."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.sum(x, dim=self.dim, keepdim=True)


def get_inputs():
    return [torch.rand(16, 1023, 257)]


def get_init_inputs():
    return [1]
