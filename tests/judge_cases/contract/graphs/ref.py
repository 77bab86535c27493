"""A linear layer then ReLU: the reference for candidates that replay CUDA graphs (PyTorch's own graph trees under
torch.compile, a graph captured by hand) or return tensors the worker cannot share as they are."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.fc = nn.Linear(n_in, n_out)

    def forward(self, x):
        return torch.relu(self.fc(x))


def get_inputs():
    return [torch.randn(256, 512)]


def get_init_inputs():
    return [512, 384]
