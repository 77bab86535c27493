"""Softplus: the candidates write files into their working directory."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.nn.functional.softplus(x)


def get_inputs():
    return [torch.randn(128, 300)]


def get_init_inputs():
    return []
