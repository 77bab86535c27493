"""Weight and bias packed into one parameter at construction: no key maps, so it is judged as KernelBench judges
it, after the same seed with its own initialisation, and the verdict says the weights were not changed."""
import torch
import torch.nn as nn

EXPECT = None
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def __init__(self, i, o):
        super().__init__()
        lin = nn.Linear(i, o)
        self.wb = nn.Parameter(torch.cat([lin.weight.detach(), lin.bias.detach()[:, None]], 1))

    def forward(self, x):
        return (x @ self.wb[:, :-1].T + self.wb[:, -1]) * 2.0
