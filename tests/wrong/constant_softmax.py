"""A constant 1/N 'softmax': every row sums to 1, and allclose(atol=1e-4) passes it at the benchmark shape."""
import torch
import torch.nn as nn

PROBLEM = "softmax"
EXPECT = r"over budget"
KIND = "wrong_output"
DEVICES = ("cuda", "cpu")


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.full_like(x, 1.0 / x.size(1))
