import torch
import torch.nn as nn


class Model(nn.Module):
    """A linear layer then GELU: weights the judge casts to the judged dtype and changes between calls."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x))


def get_inputs():
    return [torch.randn(128, 1024)]


def get_init_inputs():
    return [1024, 512]
