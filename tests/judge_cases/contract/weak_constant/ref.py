"""A degenerate reference: a softmax over a dimension of one element, so every output is 1 whatever the input. A
constant passes every check it makes; the judge says so beside any verdict (kp.judge.probes)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)


batch_size = 4096


def get_inputs():
    return [torch.randn(batch_size, 1)]


def get_init_inputs():
    return []
