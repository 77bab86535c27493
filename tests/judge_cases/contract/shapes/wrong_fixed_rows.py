"""Rows in blocks of 16 up to the benchmark's 64, a count written in: right at 64 rows and fewer (slices clip),
rows past 64 left zero at a larger batch. Accepted without --shapes (KernelBench's contract allows it)."""
import torch
import torch.nn as nn

EXPECT = (
    r"^shapes: right at 64x1000, 63x999 \(odd\), 32x500 \(half\) and 1x1000 \(one\), "
    r"wrong at 128x2000 \(double sizes\): .*relL2"
)
KIND = "wrong_output"
DEVICES = ("cuda", "cpu")
FLAGS = ("--allow-torch", "--shapes", "4")


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.zeros_like(x)
        for i in range(0, 64, 16):
            out[i:i + 16] = torch.softmax(x[i:i + 16], dim=1)
        return out
