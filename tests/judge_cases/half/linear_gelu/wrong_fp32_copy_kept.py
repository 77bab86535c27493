"""Keeps an fp32 copy of its weights made at its first call (from the weights the judge loaded): right until the
weights change, stale after the first change."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = r"^trial 2 \(seed \d+, after an? .*\): .*stale weight cache"
KIND = "wrong_output"
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch", "--precision", "bf16")


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.w32, self.b32 = None, None

    def forward(self, x):
        if self.w32 is None:
            self.w32 = self.linear.weight.detach().float().clone()
            self.b32 = self.linear.bias.detach().float().clone()
        return F.gelu(F.linear(x.float(), self.w32.to(x.device), self.b32.to(x.device))).to(x.dtype)
