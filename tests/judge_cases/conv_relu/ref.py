"""A convolution with a following activation: Conv2d (3x3, padding 1) then ReLU."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, cin, cout, k):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, padding=k // 2)

    def forward(self, x):
        return torch.relu(self.conv(x))


def get_inputs():
    return [torch.rand(16, 8, 62, 66)]


def get_init_inputs():
    return [8, 16, 3]
