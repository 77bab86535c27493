"""Subtracts the row max from x in place (saving itself a buffer) and returns a correct softmax: the output
matches, but the caller's tensor was changed."""
import torch
import torch.nn as nn

PROBLEM = "softmax"
EXPECT = r"input 0 was modified"
KIND = "input_modified"
DEVICES = ("cuda", "cpu")


class ModelNew(nn.Module):
    def forward(self, x):
        x.sub_(x.amax(dim=1, keepdim=True))
        return torch.softmax(x, dim=1)
