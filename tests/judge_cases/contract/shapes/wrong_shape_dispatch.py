"""A dispatch on the exact benchmark shape, its fallback wrong (the softmax over the batch instead of the row).
Accepted without --shapes."""
import torch
import torch.nn as nn

EXPECT = r"^shapes: right at 64x1000 only, wrong at 63x999 \(odd sizes\): .*relL2"
KIND = "wrong_output"
DEVICES = ("cuda", "cpu")
FLAGS = ("--allow-torch", "--shapes", "4")


class ModelNew(nn.Module):
    def forward(self, x):
        if tuple(x.shape) == (64, 1000):
            return torch.softmax(x, dim=1)
        return torch.softmax(x, dim=0)
