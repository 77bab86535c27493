"""Tanh: the candidate's own extension does not compile, and it falls back to PyTorch."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.tanh(x)


def get_inputs():
    return [torch.randn(64, 256)]


def get_init_inputs():
    return []
