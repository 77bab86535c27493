"""Rounds the inputs to fp16 before the product (a precision shortcut): errors ~3e-4, far above the floor for
K = 2048. Rejected."""
import torch
import torch.nn as nn

EXPECT = r"trial 1.*over budget"
KIND = "wrong_output"
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def forward(self, A, B):
        return (A.half().float() @ B.half().float())
