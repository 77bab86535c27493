"""The same Triton row softmax without the maximum subtracted: right on torch.rand's [0, 1), its exponential
overflows at the inputs x100. Rejected there: Triton runs, and its kernel is judged like any other."""
import torch
import torch.nn as nn
import triton
import triton.language as tl

EXPECT = r"inputs scaled x100"
KIND = "non_finite"
DEVICES = ("cuda",)
NEEDS = ("triton",)


@triton.jit
def _softmax_rows_unshifted(x_ptr, y_ptr, cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    x = tl.load(x_ptr + row * stride + offs, mask=mask, other=-float("inf"))
    e = tl.exp(x)
    tl.store(y_ptr + row * stride + offs, e / tl.sum(e, axis=0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        _softmax_rows_unshifted[(x.shape[0],)](x, y, x.shape[1], x.stride(0),
                                               BLOCK=triton.next_power_of_2(x.shape[1]))
        return y
