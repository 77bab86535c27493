"""Returns its output while a thread it started keeps rewriting it: the work runs on after the stop event, and the
output is still being written while the judge takes it (on the CPU a tensor crosses by moving its storage, which a
thread still writing the old one would crash on: the verdict must be the thread, not a crash)."""
import threading
import time

import torch
import torch.nn as nn

PROBLEM = "softmax"
EXPECT = r"thread the candidate started is still working after the call returned"
KIND = "tampering"
DEVICES = ("cuda", "cpu")


def _keep_writing(x, out, seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        torch.softmax(x, dim=1, out=out)


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        threading.Thread(target=_keep_writing, args=(x, out, 2.0), daemon=True).start()
        return out
