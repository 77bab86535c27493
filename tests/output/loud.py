"""A right ReLU that writes 5 MiB to stdout and to stderr at every call: the judge keeps the start and the end of
what it writes, says how much was cut, and neither the terminal nor a slot's log nor the disk takes the rest."""

import sys

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        sys.stdout.write("o" * (5 << 20) + "\n")
        sys.stderr.write("e" * (5 << 20) + "\n")
        return torch.relu(x)
