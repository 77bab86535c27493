"""Returns the minimum and its index: both elements of the tuple are wrong; the reason names output[0]."""
import torch.nn as nn

EXPECT = r"trial 1 .*output\[0\]"
KIND = "wrong_output"
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def forward(self, x):
        return x.amin(1), x.argmin(1)
