"""Wrong at the first call: the tanh approximation of GELU (about 1e-3 away from the erf form the reference uses)."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.nn.functional.gelu(x, approximate="tanh")
