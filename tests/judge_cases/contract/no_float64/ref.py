"""A reference that cannot run in float64 at all (it insists on fp32 inputs): the judge says so in one line and
judges against PyTorch's fp32 output with the wider budget."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        if x.dtype != torch.float32:
            raise TypeError("this model runs in float32 only")
        return torch.cumsum(x, dim=1)


def get_inputs():
    return [torch.rand(32, 500)]


def get_init_inputs():
    return []
