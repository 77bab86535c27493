"""Takes host memory in 256 MiB steps, up to twice the box's limit (KP_SANDBOX_MEM_GB, which the test sets)."""
import os

import torch
import torch.nn as nn

EXPECT = r"MemoryError"


class ModelNew(nn.Module):
    def forward(self, x):
        held, step = [], 256 << 20
        for _ in range(int(2 * float(os.environ["KP_SANDBOX_MEM_GB"]) * (1 << 30)) // step):
            held.append(bytearray(step))
        return torch.relu(x)
