"""Reads only the upper halves of A and B (the problem's premise): accepted; the shifted derived input is skipped
with its reason."""
import torch
import torch.nn as nn

EXPECT = None
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def forward(self, A, B):
        return torch.triu(torch.triu(A) @ torch.triu(B))
