"""Soft assignment of 512-wide features to 32 clusters (NetVLAD's first step): a product, then a softmax over the
clusters. At the inputs x100 the logits are a hundred times larger and the softmax turns their rounding, relative to
their size, into an error of the output a hundred times larger: a kernel that sums the product in order in fp32 is
honest there and over the budget's floor, which does not know the softmax amplifies."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.clusters = nn.Parameter(torch.randn(512, 32) / 512 ** 0.5)

    def forward(self, x):
        return torch.softmax(x @ self.clusters, dim=-1)


def get_inputs():
    return [torch.randn(256, 512)]


def get_init_inputs():
    return []
