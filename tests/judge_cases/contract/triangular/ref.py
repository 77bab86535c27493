"""Product of two upper-triangular matrices (KernelBench level 1 problem 14): every draw has the same zero pattern,
which a kernel may rightly skip. A shifted input would break it, so that derived input is not used."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, A, B):
        return torch.triu(torch.matmul(A, B))


def get_inputs():
    return [torch.triu(torch.randn(96, 96)), torch.triu(torch.randn(96, 96))]


def get_init_inputs():
    return []
