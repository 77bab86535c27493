"""The reference's own code under another name."""
import torch
import torch.nn as nn

EXPECT = None
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def __init__(self, input_size, hidden, layers, batch):
        super().__init__()
        self.gru = nn.GRU(input_size, hidden, layers, batch_first=False)
        self.h0 = torch.randn((layers, batch, hidden))

    def forward(self, x):
        self.h0 = self.h0.to(x.device)
        return self.gru(x, self.h0)[0]
