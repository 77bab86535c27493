"""Buffers updated in training mode: BatchNorm1d on a (batch, features) tensor. A fresh Model is in training mode:
it normalises with the batch statistics and moves running_mean / running_var (unbiased) by the momentum."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.bn = nn.BatchNorm1d(features)

    def forward(self, x):
        return self.bn(x)


def get_inputs():
    return [torch.rand(1024, 300)]


def get_init_inputs():
    return [300]
