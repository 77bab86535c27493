"""Tries to build its extension, catches the compiler's failure and runs PyTorch instead (a pattern of machine-
written candidates): accepted as pure PyTorch, and the verdict names the extension and the compiler's first error,
so the author knows the kernel never ran."""
from pathlib import Path

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load

EXPECT = None
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)

Path("tanh_ext.cpp").write_text("dim3 grid(1);  // host launch code in a C++ file: dim3 is not declared here\n")
try:
    ext = load(name="tanh_ext", sources=["tanh_ext.cpp"], verbose=False)
except Exception:
    ext = None


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.tanh(x) if ext is not None else torch.tanh(x)
