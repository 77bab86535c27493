"""Normalises over the last two dimensions only (each feature map apart), with the reference's affine parameters:
rejected at the smaller shape on the CPU."""
import torch
import torch.nn as nn

EXPECT = r"relL2"
KIND = "wrong_output"
DEVICES = ("cpu",)
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x):
        mean = x.mean(dim=(-2, -1), keepdim=True)
        var = x.var(dim=(-2, -1), keepdim=True, unbiased=False)
        return (x - mean) / torch.sqrt(var + self.ln.eps) * self.ln.weight + self.ln.bias
