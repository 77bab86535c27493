"""The softmax written out (max subtracted, exp, sum): right at every shape of the family."""
import torch
import torch.nn as nn

EXPECT = None
DEVICES = ("cuda", "cpu")
FLAGS = ("--allow-torch", "--shapes", "4")


class ModelNew(nn.Module):
    def forward(self, x):
        e = torch.exp(x - x.amax(dim=1, keepdim=True))
        return e / e.sum(dim=1, keepdim=True)
