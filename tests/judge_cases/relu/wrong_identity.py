"""Returns its input: ReLU is the identity on torch.rand's [0, 1), so only the derived inputs (negated, shifted)
can tell."""
import torch.nn as nn

EXPECT = r"inputs (negated|shifted -10)"
KIND = "wrong_output"
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def forward(self, x):
        return x.clone()
