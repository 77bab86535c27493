"""Argmax over the middle of three dimensions of a 128 x 4096 x 4095 float32 tensor (8.6 GB in, 4 MB of int64 out):
the judge's time when the input is the whole footprint and the output is indices."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.argmax(x, dim=1)


def get_inputs():
    return [torch.rand(128, 4096, 4095)]


def get_init_inputs():
    return []
