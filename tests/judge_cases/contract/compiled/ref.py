"""GELU then a scale."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.nn.functional.gelu(x) * 0.5


def get_inputs():
    return [torch.randn(64, 512)]


def get_init_inputs():
    return []
