"""Remembers its answer by the input's address: right at the first call, stale at every later one whose inputs
arrive in the same buffer. The judge refills one buffer for successive calls of one layout, so the second parity
call is already wrong, and the reason names no weight change (ReLU has no weights)."""
import torch
import torch.nn as nn

EXPECT = r"^trial 2 \(seed \d+\): relL2 \S+ over budget \S+ \(worst row \S+, row budget \S+\)$"
KIND = "wrong_output"
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.cache = {}

    def forward(self, x):
        key = (x.data_ptr(), tuple(x.shape))
        if key not in self.cache:
            self.cache[key] = torch.relu(x)
        return self.cache[key]
