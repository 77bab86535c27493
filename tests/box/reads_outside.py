"""Reads a file that lies outside what the box was given (the test makes it and names it in KP_PROBE_SECRET)."""
import os

import torch
import torch.nn as nn

EXPECT = r"No such file or directory|Permission denied"


class ModelNew(nn.Module):
    def forward(self, x):
        with open(os.environ["KP_PROBE_SECRET"]) as f:
            f.read()
        return torch.relu(x)
