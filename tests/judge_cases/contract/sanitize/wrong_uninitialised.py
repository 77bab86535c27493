"""Row sums with the candidates' shared kernel (row_sum.cu, mode 3): the warps' partials through a scratch buffer left
uninitialised, warp 0 reading all 32 slots of a row and keeping the 8 written: right on every call (accepted without
--sanitize), rejected by initcheck."""
import torch.nn as nn

from _row_sum import ext

EXPECT = r"sanitize: compute-sanitizer initcheck: .*[Uu]ninitialized .*in void row_sum_kernel<\(int\)3>"
KIND = "memory_error"
DEVICES = ("cuda",)
FLAGS = ("--sanitize", "--no-bench")


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.row_sum(x.contiguous(), 3)
