"""The mean, then the mean squared deviation, each summed in order in fp32, one term at a time: accepted, also at
the shifted input, whose budget's floor grows with the inputs' RMS (a budget that did not grow rejected it on some
seeds at a shift of -3)."""
import torch
import torch.nn as nn

EXPECT = None
DEVICES = ("cuda", "cpu")
FLAGS = ("--allow-torch",)


def in_order(x):
    acc = torch.zeros(x.shape[0], dtype=x.dtype, device=x.device)
    for j in range(x.shape[1]):
        acc = acc + x[:, j]
    return acc


class ModelNew(nn.Module):
    def forward(self, x):
        n = x.shape[1]
        d = x - (in_order(x) / n)[:, None]
        return d / torch.sqrt(in_order(d * d) / n + 1e-5)[:, None]
