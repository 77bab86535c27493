"""A small ReLU: the batch tests judge many candidates against it in seconds on a CPU."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(64, 1000)]


def get_init_inputs():
    return []
