"""Integer inputs: an embedding lookup of int64 indices (the judge keeps them as they are for the float64
reference, and derives no scaled or negated variants of them)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, num, dim):
        super().__init__()
        self.emb = nn.Embedding(num, dim)

    def forward(self, idx):
        return self.emb(idx)


def get_inputs():
    return [torch.randint(0, 5000, (512, 37))]


def get_init_inputs():
    return [5000, 96]
