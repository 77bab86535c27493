"""Row sums with the candidates' shared kernel (row_sum.cu, mode 2): no barrier at a row's end, so the next row's
partials may overwrite the shared memory warp 0 still reads: a race that in practice never loses (accepted without
--sanitize), rejected by racecheck."""
import torch.nn as nn

from _row_sum import ext

EXPECT = r"sanitize: compute-sanitizer racecheck: .*in void row_sum_kernel<\(int\)2>"
KIND = "race"
DEVICES = ("cuda",)
FLAGS = ("--sanitize", "--no-bench")


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.row_sum(x.contiguous(), 2)
