"""A Triton kernel that does not compile (`break` inside a loop, which Triton's language lacks). Rejected with the
compiler's own message and the kernel's file:line, in one line: no IR dump, no traceback through Triton."""
import torch
import torch.nn as nn
import triton
import triton.language as tl

EXPECT = r"Triton compile error in _softmax_rows_break \(wrong_compile_error.py:24\): .*Break"
KIND = "build"
DEVICES = ("cuda",)
NEEDS = ("triton",)


@triton.jit
def _softmax_rows_break(x_ptr, y_ptr, cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < cols
        x = tl.load(x_ptr + row * stride + offs, mask=mask, other=0.0)
        acc += tl.exp(x)
        if start > cols:
            break
    tl.store(y_ptr + row * stride + tl.arange(0, BLOCK), acc)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        _softmax_rows_break[(x.shape[0],)](x, y, x.shape[1], x.stride(0), BLOCK=1024)
        return y
