"""Argmax over the rows of a 4096 x 393216 fp32 tensor (6 GiB of inputs)."""
import torch
import torch.nn as nn

batch_size = 4096
dim = 393216


class Model(nn.Module):
    def forward(self, x):
        return torch.argmax(x, dim=1)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
