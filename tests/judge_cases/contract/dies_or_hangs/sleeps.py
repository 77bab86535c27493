"""Takes 15 s per call, run with --timeout 8: rejected at the limit, naming the stage it was in and what passed
before it (one limit for the whole job, a single run as in a batch)."""
import time

import torch
import torch.nn as nn

EXPECT = r"trial \d.*timeout after 8 s, in this stage \(passed before it: "
DEVICES = ("cpu",)
FLAGS = ("--allow-torch", "--timeout", "8")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls > 1:
            time.sleep(15)
        return torch.sigmoid(x)
