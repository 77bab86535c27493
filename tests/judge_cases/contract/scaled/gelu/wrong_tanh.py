"""The tanh approximation of GELU, 1e-3 away from the erf form: rejected at the smaller shape on the CPU."""
import torch.nn as nn
import torch.nn.functional as F

EXPECT = r"relL2"
KIND = "wrong_output"
DEVICES = ("cpu",)
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def forward(self, x):
        return F.gelu(x, approximate="tanh")
