"""The same sum, one column short: the last term of rowsum(dy * y) is never added. Off by ~1e-3 relative on the
fresh rows, where no widening applies (rejected at the first call)."""
import torch
import torch.nn as nn

EXPECT = r"trial 1 .*over budget"
KIND = "wrong_output"
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def forward(self, y, dy):
        return y * (dy - (y * dy)[:, :-1].sum(1, keepdim=True))
