"""Accumulates in bf16 over the long reduction (the running sum rounded to bf16 after every block of 16 terms): 256
roundings of a growing sum where PyTorch rounds once."""
import torch
import torch.nn as nn

EXPECT = r"^trial 1 \(seed \d+\): relL2 \S+ over budget"
KIND = "wrong_output"
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch", "--precision", "bf16")


class ModelNew(nn.Module):
    def forward(self, a, b):
        acc = torch.zeros(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
        for k in range(0, a.shape[1], 16):
            acc = acc + (a[:, k:k + 16].float() @ b[k:k + 16].float()).to(a.dtype)
        return acc
