"""Calls sys.exit(0) inside its first call, as a script's error path does: the verdict names the exit and where it
was asked for, instead of a process that died with exit code 0 and said nothing."""
import sys

import torch.nn as nn

EXPECT = r"trial 1.*raised SystemExit: the candidate's code asked its process to exit"
KIND = "crash"
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def forward(self, x):
        sys.exit(0)
