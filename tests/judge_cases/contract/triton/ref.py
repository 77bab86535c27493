"""Softmax over the last dimension of a (rows, cols) matrix: the row kernel most Triton tutorials start from."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)


batch_size = 512
dim = 4000


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
