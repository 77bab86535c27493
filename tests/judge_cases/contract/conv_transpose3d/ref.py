"""A 3-D transposed convolution: cuDNN has several fp32 algorithms for it, and a candidate may let cuDNN pick among
them (cudnn.benchmark) or run it in channels-last layout."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, c_in, c_out, k):
        super().__init__()
        self.conv = nn.ConvTranspose3d(c_in, c_out, k, stride=2, padding=1)

    def forward(self, x):
        return self.conv(x)


def get_inputs():
    return [torch.randn(8, 32, 12, 24, 24)]


def get_init_inputs():
    return [32, 16, 3]
