"""A Triton row softmax whose mask stops one column short: the last column is never written (NaN where the judge
filled unwritten memory). Rejected at its first call."""
import torch
import torch.nn as nn
import triton
import triton.language as tl

EXPECT = r"trial 1"
KIND = "non_finite"
DEVICES = ("cuda",)
NEEDS = ("triton",)


@triton.jit
def _softmax_rows_short(x_ptr, y_ptr, cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols - 1
    x = tl.load(x_ptr + row * stride + offs, mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * stride + offs, e / tl.sum(e, axis=0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        _softmax_rows_short[(x.shape[0],)](x, y, x.shape[1], x.stride(0), BLOCK=triton.next_power_of_2(x.shape[1]))
        return y
