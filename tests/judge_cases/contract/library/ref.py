"""RMSNorm over the last dimension with a learned scale, as a transformer's norm layer computes it: the kind of layer a
training library ships its own Triton kernels for."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, hidden, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def get_inputs():
    return [torch.randn(2048, 4096)]


def get_init_inputs():
    return [4096]
