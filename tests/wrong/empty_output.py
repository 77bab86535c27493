"""Returns torch.empty_like(x): never writes the output. The checker fills the allocator's cached free memory with
NaN before each call, so the unwritten output reads NaN instead of whatever a previous call left there."""
import torch
import torch.nn as nn

PROBLEM = "softmax"
EXPECT = r"NaN/Inf positions differ"
KIND = "non_finite"
DEVICES = ("cuda",)


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.empty_like(x)
