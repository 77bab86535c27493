"""Correct and honest, but it is PyTorch's own softmax: no kernel of the candidate's ran. (On --device cpu there is
no own-kernel check, and this file is accepted with a verdict that says so: tests/test_judge.py asserts that too;
--allow-torch accepts it on the GPU, labelled pure PyTorch.)"""
import torch
import torch.nn as nn

PROBLEM = "softmax"
EXPECT = r"no kernel of the row's own ran"
KIND = "own_kernel"
DEVICES = ("cuda",)


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)
