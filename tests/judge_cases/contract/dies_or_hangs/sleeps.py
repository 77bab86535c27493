"""Takes 60 s per call after its first, run with --timeout 20 (room for a box's start and the first call on a
loaded host): rejected at the limit, naming the stage it was in and what passed
before it (one limit for the whole job, a single run as in a batch)."""
import time

import torch
import torch.nn as nn

EXPECT = r"trial \d.*timeout after 20 s, in this stage \(passed before it: "
KIND = "timeout"
DEVICES = ("cpu",)
FLAGS = ("--allow-torch", "--timeout", "20")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls > 1:
            time.sleep(60)
        return torch.sigmoid(x)
