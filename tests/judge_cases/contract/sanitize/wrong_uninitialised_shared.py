"""Row sums with the candidates' shared kernel (row_sum.cu, mode 4): warp 0 reads all 32 shared-memory slots and masks
the 24 never written by multiplying them by 0, right while whatever an earlier kernel left there is finite
(accepted without --sanitize); with every SM's shared memory filled with 0xFF bytes before the call its sums are
NaN, and the shared-memory pass rejects it (no compute-sanitizer tool tracks unwritten shared memory)."""
import torch.nn as nn

from _row_sum import ext

EXPECT = r"sanitize: shared memory: its output is NaN or Inf at \d+ of \d+ positions .* shared memory it never wrote"
KIND = "memory_error"
DEVICES = ("cuda",)
FLAGS = ("--sanitize", "--no-bench")


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.row_sum(x.contiguous(), 4)
