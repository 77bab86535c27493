"""Each row of 4096 values normalised to zero mean and unit variance (a layer norm without weights). A kernel that
sums in order in fp32 is honest, yet at the shifted derived input its output's error grows with the shift (the
mean's rounding is relative to the values summed, and the normalisation keeps it); one that takes the variance as
E[x^2] - mean^2 loses digits with the square of the shift."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:])


def get_inputs():
    return [torch.randn(64, 4096)]


def get_init_inputs():
    return []
