"""A correct pure-PyTorch candidate: the index half of torch.max."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.max(x, dim=1).indices
