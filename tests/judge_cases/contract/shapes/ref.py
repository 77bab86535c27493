"""A softmax over each row of a (batch_size, dim) input, its sizes module-level: the shape family `--shapes` judges
a candidate over (odd, half, a batch of one, double)."""
import torch
import torch.nn as nn

batch_size = 64
dim = 1000


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
