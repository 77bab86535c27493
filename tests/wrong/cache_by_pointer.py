"""Caches results by the input's data_ptr: a repeated call on the same buffer returns the stored output without
computing. The judge's calls get new contents in reused buffers (successive parity calls of one layout share one
refilled buffer; timed calls refill a pool before every call), so the stale output is caught at the second call."""
import torch
import torch.nn as nn

PROBLEM = "softmax"
EXPECT = r"over budget"
KIND = "wrong_output"
DEVICES = ("cuda",)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.cache = {}

    def forward(self, x):
        key = (x.data_ptr(), tuple(x.shape))
        if key not in self.cache:
            self.cache[key] = torch.softmax(x, dim=1)
        return self.cache[key]
