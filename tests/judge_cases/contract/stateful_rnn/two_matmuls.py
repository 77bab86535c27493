"""The same recurrence without the concatenation: the input and hidden halves of i2h's weight applied as two matrix
products. Keeps its hidden state as the reference does, so it is right at every call in the same sequence. Accepted."""
import torch
import torch.nn as nn

EXPECT = None
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)

batch_size = 8


class ModelNew(nn.Module):
    def __init__(self, input_size: int, hidden_size: int, output_size: int):
        super().__init__()
        self.input_size = input_size
        self.hidden = torch.randn((batch_size, hidden_size))
        self.i2h = nn.Linear(input_size + hidden_size, hidden_size)
        self.h2o = nn.Linear(hidden_size, output_size)

    def forward(self, x):
        self.hidden = self.hidden.to(x.device)
        w = self.i2h.weight
        h = x @ w[:, :self.input_size].t() + self.hidden @ w[:, self.input_size:].t() + self.i2h.bias
        self.hidden = torch.tanh(h)
        return self.h2o(self.hidden)
