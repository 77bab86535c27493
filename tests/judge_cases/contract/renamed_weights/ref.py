"""A convolution, a learned per-channel bias added after it, then ReLU (the shape of KernelBench's level-2 conv
problems): three parameters, conv.weight, conv.bias and bias, each of a shape of its own."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        return torch.relu(self.conv(x) + self.bias)


batch_size = 16
in_channels, out_channels, kernel_size = 3, 16, 3
height = width = 32
bias_shape = (out_channels, 1, 1)


def get_inputs():
    return [torch.rand(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, bias_shape]
