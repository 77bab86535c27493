"""The benchmark's shape written into a view: raises at any other shape. Accepted without --shapes."""
import torch
import torch.nn as nn

EXPECT = r"^shapes: right at 64x1000 only, wrong at 63x999 \(odd sizes\): .*raised RuntimeError"
KIND = "raised"
DEVICES = ("cuda", "cpu")
FLAGS = ("--allow-torch", "--shapes", "4")


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.softmax(x.view(64, 1000), dim=1)
