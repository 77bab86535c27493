"""A GRU whose initial hidden state is a plain tensor attribute moved in forward (KernelBench's RNN problems): the
float64 reference must convert it too."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, input_size, hidden, layers, batch):
        super().__init__()
        self.gru = nn.GRU(input_size, hidden, layers, batch_first=False)
        self.h0 = torch.randn((layers, batch, hidden))

    def forward(self, x):
        self.h0 = self.h0.to(x.device)
        out, _ = self.gru(x, self.h0)
        return out


def get_inputs():
    return [torch.randn(12, 6, 16)]


def get_init_inputs():
    return [16, 24, 2, 6]
