"""Returns a view of its input without touching it, where that is the right answer (inputs clamped at 0 already are
their ReLU): here it is not, so it is rejected on the values, not by a crash of its worker."""
import torch.nn as nn

EXPECT = r"trial 1.*relL2"
KIND = "wrong_output"
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def forward(self, x):
        return x.view(-1).view(x.shape)
