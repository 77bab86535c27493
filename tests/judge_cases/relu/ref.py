"""Elementwise: ReLU of a float32 matrix with an odd column count."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.rand(2048, 4099)]


def get_init_inputs():
    return []
