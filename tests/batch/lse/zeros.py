"""Zeros of the right shape."""
import torch
import torch.nn as nn

EXPECT = r"relL2 1\.00e\+00 .*over budget"


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.zeros(x.size(0), 1, device=x.device)
