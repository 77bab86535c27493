"""Returns its output before the work is done and lets a thread finish it a moment later: the timed call would
measure an empty launch while the real work runs after the stop event."""
import threading

import torch
import torch.nn as nn

PROBLEM = "softmax"
EXPECT = r"thread the candidate started is still working after the call returned"
KIND = "tampering"
DEVICES = ("cuda", "cpu")


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        threading.Timer(0.2, lambda: torch.softmax(x, dim=1, out=out)).start()
        return out
