"""cumsum written another way: accepted within the fp32-only budget, with the note that no float64 reference ran."""
import torch
import torch.nn as nn

EXPECT = None
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.cumsum(x.double(), dim=1).float()
