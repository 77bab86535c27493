"""Conv then BatchNorm: a fresh Model trains, so BatchNorm normalises with the batch's statistics."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return self.bn(self.conv(x))


def get_inputs():
    return [torch.rand(8, 3, 20, 20)]


def get_init_inputs():
    return [3, 16]
