"""Product over 256 values: near -3 it overflows fp32 (PyTorch's own fp32 too) while float64 stays finite, so the
shifted input is not held against a candidate."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.prod(x, dim=1)


def get_inputs():
    return [torch.randn(16, 256, 64)]


def get_init_inputs():
    return []
