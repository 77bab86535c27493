"""A linear layer then tanh: a model with parameters to train, judged with --backward (gradients of the input, the
weight and the bias)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.fc = nn.Linear(n_in, n_out)

    def forward(self, x):
        return torch.tanh(self.fc(x))


def get_inputs():
    return [torch.randn(64, 96)]


def get_init_inputs():
    return [96, 80]
