"""Runs a real kernel (the playground's 6_regcluster) on a side stream and returns without joining it to the
caller's stream: the CUDA events on the timed stream see almost nothing. Outputs are right (the checker
synchronizes the device before reading them), so only the escape check can catch it."""
import torch
import torch.nn as nn

from harness import Kernel

PROBLEM = "softmax"
EXPECT = r"escaped the timed stream"
KIND = "escape"
DEVICES = ("cuda",)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = Kernel("softmax", "6_regcluster")
        self.side = None

    def forward(self, x):
        if x.stride(1) != 1:
            x = x.contiguous()
        if self.side is None:
            self.side = torch.cuda.Stream()
        y = torch.empty_like(x)
        self.side.wait_stream(torch.cuda.current_stream())  # inputs are ready; the result is never waited for
        with torch.cuda.stream(self.side):
            self.k.softmax_forward(x, y)
        return y
