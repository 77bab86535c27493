"""Returns a float64 result (values right, contract wrong: the reference returns float32)."""
import torch
import torch.nn as nn

PROBLEM = "softmax"
EXPECT = r"output is Tensor .*float64"
KIND = "wrong_shape"
DEVICES = ("cuda", "cpu")


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.softmax(x.double(), dim=1)
