"""Normalises with the batch's statistics but never updates the running ones: rejected at the smaller shape on the
CPU (the running statistics are state the reference carries)."""
import torch
import torch.nn as nn

EXPECT = r"buffer"
KIND = "wrong_state"
DEVICES = ("cpu",)
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def __init__(self, num_features: int):
        super().__init__()
        self.bn = nn.BatchNorm2d(num_features=num_features)

    def forward(self, x):
        return nn.functional.batch_norm(x, None, None, self.bn.weight, self.bn.bias, True, 0.0, self.bn.eps)
