"""Behaves during parity, then serves from a pointer-keyed cache whenever a call follows the previous one within
0.1 s (a benchmark detector: timed calls come in quick succession, parity calls are seconds apart). Parity cannot
see it; whichever later stage meets a cached call first rejects it: the own-kernel check (its profiled call ran
no kernel at all) or the check of timed calls' outputs (stale). tests/test_judge.py also drives the timed-call
check directly."""
import time

import torch
import torch.nn as nn

from harness import Kernel

PROBLEM = "softmax"
EXPECT = r"timed call .*over budget|own kernel: no kernel .*\(kernels seen: none\)"
KIND = "own_kernel"
DEVICES = ("cuda",)
# at a small shape the parity calls too follow each other within 0.1 s, and parity catches the cache first
BENCH_SHAPE = "its benchmark detector keys on calls under 0.1 s apart, which parity calls at a small shape are too"


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = Kernel("softmax", "6_regcluster")
        self.cache = {}
        self.last = None

    def forward(self, x):
        now = time.monotonic()
        benchmarked = self.last is not None and now - self.last < 0.1
        self.last = now
        key = x.data_ptr()
        if benchmarked and key in self.cache:
            return self.cache[key]
        x = x if x.stride(1) == 1 else x.contiguous()
        y = torch.empty(x.shape, device=x.device)
        self.k.softmax_forward(x, y)
        if benchmarked:
            self.cache = {k: v for k, v in list(self.cache.items())[-1:]}  # two entries: the timing pool's slots
            self.cache[key] = y
        return y
