"""Writes a file into its working directory at import and reads it back, as candidates that save their
extension's source there before building it do: the judge gives each candidate a fresh, writable, private
working directory (inside the sandbox too), removed after."""
import os
from pathlib import Path

import torch
import torch.nn as nn

EXPECT = None
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)

Path("softplus_source.txt").write_text("threshold = 20\n")
THRESHOLD = float(Path("softplus_source.txt").read_text().split("=")[1])
assert not any(p.name == "ref.py" for p in Path(os.getcwd()).iterdir()), "the working directory is not private"


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.nn.functional.softplus(x, threshold=THRESHOLD)
