"""E[x] and E[x^2] summed in order in fp32 in one pass, the variance as their difference: right on the benchmark's
inputs, and off by some 30 times an honest kernel's error at the shifted input (rejected there)."""
import torch
import torch.nn as nn

EXPECT = r"^inputs shifted -10 .*relL2"
KIND = "wrong_output"
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
        m, q = in_order(x) / n, in_order(x * x) / n
        return (x - m[:, None]) / torch.sqrt(q - m * m + 1e-5)[:, None]
