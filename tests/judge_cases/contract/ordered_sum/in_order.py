"""Sums each output's 2048 products one after another in fp32, as a naive one-thread-per-output kernel does: its
error grows like sqrt(K) ulps (about 1e-6 here, above PyTorch's own 4x), within the budget's floor for K = 2048.
Accepted."""
import torch
import torch.nn as nn

EXPECT = None
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def forward(self, A, B):
        acc = torch.zeros(A.shape[0], B.shape[1], device=A.device)
        for k in range(A.shape[1]):
            acc = acc + A[:, k:k + 1] * B[k]
        return acc
