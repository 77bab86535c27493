"""A 6-layer GRU whose initial hidden state is a plain tensor attribute moved in forward (KernelBench's level-3 GRU
at a quarter of its sequence): the reference for candidates that replay cuDNN's RNN from a CUDA graph."""
import torch
import torch.nn as nn

batch_size = 10
seq_len = 128
input_size = 128
hidden_size = 256
num_layers = 6


class Model(nn.Module):
    def __init__(self, input_size, hidden_size, num_layers):
        super().__init__()
        self.gru = nn.GRU(input_size, hidden_size, num_layers, batch_first=False)
        self.h0 = torch.randn((num_layers, batch_size, hidden_size))

    def forward(self, x):
        self.h0 = self.h0.to(x.device)
        output, _ = self.gru(x, self.h0)
        return output


def get_inputs():
    return [torch.randn(seq_len, batch_size, input_size)]


def get_init_inputs():
    return [input_size, hidden_size, num_layers]
