"""Returns the lower triangle as well: wrong on the problem's own inputs."""
import torch
import torch.nn as nn

EXPECT = r"trial 1.*relL2"
KIND = "wrong_output"
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def forward(self, A, B):
        return A @ B + torch.tril(torch.ones_like(A), -1)
