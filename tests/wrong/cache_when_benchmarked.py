"""Behaves during parity, then caches by pointer once it sees the benchmark shape repeatedly (a benchmark
detector). Only the re-check of the timed calls' outputs can catch this."""
import torch
import torch.nn as nn

from harness import Kernel

PROBLEM = "softmax"
EXPECT = r"timed call .*over budget"
DEVICES = ("cuda",)
_seen = {}


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = Kernel("softmax", "6_regcluster")
        self.cache = {}

    def forward(self, x):
        n = _seen[tuple(x.shape)] = _seen.get(tuple(x.shape), 0) + 1
        key = x.data_ptr()
        if n > 4 and key in self.cache:
            return self.cache[key]
        x = x if x.stride(1) == 1 else x.contiguous()
        y = torch.empty(x.shape, device=x.device)
        self.k.softmax_forward(x, y)
        if n > 4:
            self.cache[key] = y
        return y
