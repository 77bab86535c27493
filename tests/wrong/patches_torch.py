"""Replaces torch.softmax in its process at import time with a slower one, which would slow the eager and
torch.compile baselines timed in the same process and flatter the candidate."""
import time

import torch
import torch.nn as nn

PROBLEM = "softmax"
EXPECT = r"replaced torch\.softmax"
KIND = "tampering"
DEVICES = ("cuda", "cpu")

_orig = torch.softmax


def _slow_softmax(*a, **k):
    time.sleep(0.001)
    return _orig(*a, **k)


torch.softmax = _slow_softmax


class ModelNew(nn.Module):
    def forward(self, x):
        return _orig(x, dim=1)
