"""Keeps h0 as a registered buffer (an extra state_dict key the reference lacks): the GRU weights still map by name,
h0 comes from the same seed, as KernelBench's contract builds both models."""
import torch
import torch.nn as nn

EXPECT = None
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def __init__(self, input_size, hidden, layers, batch):
        super().__init__()
        self.gru = nn.GRU(input_size, hidden, layers, batch_first=False)
        self.register_buffer("h0", torch.randn((layers, batch, hidden)))

    def forward(self, x):
        return self.gru(x, self.h0)[0]
