"""Correct and honest, but it is PyTorch's own softmax: no kernel of the candidate's ran. (On --device cpu there is
no own-kernel check, and this file is accepted: tests/test_checker.py asserts that too.)"""
import torch
import torch.nn as nn

PROBLEM = "softmax"
EXPECT = r"no kernel from the candidate's own build ran"
DEVICES = ("cuda",)


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)
