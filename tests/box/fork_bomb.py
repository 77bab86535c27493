"""Starts processes until the system refuses. Bounded, so that an unbounded machine survives the test: at most 3000
children, each of which execs `sleep` at once (a fork of this process would hold its page tables)."""
import os

import torch
import torch.nn as nn

EXPECT = r"Resource temporarily unavailable"
MAX = 3000


class ModelNew(nn.Module):
    def forward(self, x):
        for _ in range(MAX):
            if os.fork() == 0:
                try:
                    os.execv("/bin/sleep", ["sleep", "60"])
                finally:
                    os._exit(0)
        return torch.relu(x)
