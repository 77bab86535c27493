"""Keeps the reference's names but stores the weights pre-scaled by 2: right at its own same-seed initialisation,
wrong once the reference's weights are loaded by name. The verdict says so."""
import torch
import torch.nn as nn

EXPECT = r"trial 1.*relL2.*right at its own same-seed initialisation, wrong with the reference's weights loaded by name"
KIND = "wrong_output"
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def __init__(self, i, o):
        super().__init__()
        self.linear = nn.Linear(i, o)
        with torch.no_grad():
            self.linear.weight.mul_(2.0)
            self.linear.bias.mul_(2.0)

    def forward(self, x):
        return self.linear(x)
