"""ReLU of a 64 x 1000 float32 matrix: the smallest job, where the judge's own start-up is all there is."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(64, 1000)]


def get_init_inputs():
    return []
