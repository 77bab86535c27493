"""torch.compile with mode="reduce-overhead": PyTorch's CUDA-graph trees replay the forward, and its outputs live in
the graphs' private memory pool, which CUDA cannot export to another process. Accepted: the judge receives a copy."""
import torch
import torch.nn as nn

EXPECT = None
DEVICES = ("cuda",)
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.fc = nn.Linear(n_in, n_out)
        self.f = torch.compile(self._forward, mode="reduce-overhead")

    def _forward(self, x):
        return torch.relu(self.fc(x))

    def forward(self, x):
        return self.f(x)
