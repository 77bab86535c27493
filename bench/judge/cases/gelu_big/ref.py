"""GELU of a 4096 x 393216 float32 matrix (6.4 GB in, 6.4 GB out): the judge's time on a memory-bound problem
whose inputs alone fill a tenth of the GPU."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.nn.functional.gelu(x)


def get_inputs():
    return [torch.rand(4096, 393216)]


def get_init_inputs():
    return []
