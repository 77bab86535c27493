"""Computes the softmax in bfloat16 and returns float32: faster, 8 mantissa bits, not fp32 mode."""
import torch
import torch.nn as nn

PROBLEM = "softmax"
EXPECT = r"over budget"
KIND = "wrong_output"
DEVICES = ("cuda", "cpu")


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.softmax(x.bfloat16(), dim=1).float()
