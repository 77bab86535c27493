"""Off by one position: rejected against the fp32 output all the same."""
import torch
import torch.nn as nn

EXPECT = r"trial 1.*relL2"
KIND = "wrong_output"
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.cumsum(x, dim=1) - x
