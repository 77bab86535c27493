"""The logits clamped to [-30, 30] before the softmax (a guard against overflow): exact on the benchmark's inputs,
whose logits stay within a few units, and far off at the inputs x100, further than honest roundings move the
reference there (rejected at that input, the budget widened first)."""
import torch
import torch.nn as nn

EXPECT = r"^inputs scaled x100 .*relL2"
KIND = "wrong_output"
DEVICES = ("cuda", "cpu")
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.clusters = nn.Parameter(torch.randn(512, 32) / 512 ** 0.5)

    def forward(self, x):
        return torch.softmax(torch.clamp(x @ self.clusters, -30, 30), dim=-1)
