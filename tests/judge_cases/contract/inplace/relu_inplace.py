"""Writes its output over its input (torch.relu_): its output is a view of the judge's input. The verdict is the
modified input, on the CPU and on the GPU alike (the worker sends such an output back as a copy)."""
import torch
import torch.nn as nn

EXPECT = r"input 0 was modified"
KIND = "input_modified"
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu_(x)
