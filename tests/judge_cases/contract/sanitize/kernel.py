"""Row sums with the candidates' shared kernel (row_sum.cu, mode 0): right, and clean under every tool: accepted with
--sanitize."""
import torch.nn as nn

from _row_sum import ext

EXPECT = None
KIND = None
DEVICES = ("cuda",)
FLAGS = ("--sanitize", "--no-bench")


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.row_sum(x.contiguous(), 0)
