"""A reference whose output is its input: a shift held in a buffer of zeros that no weight change moves (a buffer,
not a parameter). The input passed through passes every check; the judge says so (kp.judge.probes)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.register_buffer("shift", torch.zeros(dim))

    def forward(self, x):
        return x + self.shift


batch_size = 256
dim = 1024


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim]
