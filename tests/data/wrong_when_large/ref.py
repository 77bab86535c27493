"""LeakyReLU over a batch of long rows: 4096 x 16384 fp32 (256 MiB), too large for a small CPU budget."""

import torch
import torch.nn as nn

batch_size = 4096
dim = 16384


class Model(nn.Module):
    def forward(self, x):
        return torch.nn.functional.leaky_relu(x, 0.01)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
