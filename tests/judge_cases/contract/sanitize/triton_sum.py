"""Row sums in Triton, one program per row in rounds of 1024 masked columns: right, and clean under every tool,
accepted with --sanitize (compute-sanitizer runs Triton's kernels as any other)."""
import torch
import torch.nn as nn
import triton
import triton.language as tl

EXPECT = None
DEVICES = ("cuda",)
NEEDS = ("triton",)
FLAGS = ("--sanitize", "--no-bench")


@triton.jit
def _row_sums(x_ptr, y_ptr, cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + row * stride + offs, mask=offs < cols, other=0.0)
    tl.store(y_ptr + row, tl.sum(acc, axis=0))


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty(x.shape[0], device=x.device, dtype=x.dtype)
        _row_sums[(x.shape[0],)](x, y, x.shape[1], x.stride(0), BLOCK=1024)
        return y
