import torch
import torch.nn as nn


class Model(nn.Module):
    """Values in the thousands: x100 of them is beyond fp16's range (65504), not beyond fp32's."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.tanh(x * 1e-3)


def get_inputs():
    return [torch.randn(64, 1024) * 1000]


def get_init_inputs():
    return []
