"""A pure-PyTorch rewrite: amax and argmax separately."""
import torch.nn as nn

EXPECT = None
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def forward(self, x):
        return x.amax(1), x.argmax(1)
