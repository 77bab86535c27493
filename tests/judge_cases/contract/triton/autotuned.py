"""A Triton row softmax under @triton.autotune (three warp counts, keyed on the row length): the autotuner's
benchmarking runs at the first call, booked as build time and never timed. Accepted as its own kernel."""
import torch
import torch.nn as nn
import triton
import triton.language as tl

EXPECT = None
DEVICES = ("cuda",)
NEEDS = ("triton",)


@triton.autotune(configs=[triton.Config({}, num_warps=w) for w in (2, 4, 8)], key=["cols"])
@triton.jit
def _softmax_rows_tuned(x_ptr, y_ptr, cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    x = tl.load(x_ptr + row * stride + offs, mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * stride + offs, e / tl.sum(e, axis=0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        _softmax_rows_tuned[(x.shape[0],)](x, y, x.shape[1], x.stride(0), BLOCK=triton.next_power_of_2(x.shape[1]))
        return y
