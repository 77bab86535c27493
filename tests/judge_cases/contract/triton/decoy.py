"""Defines a Triton kernel it never launches and computes with torch.softmax. Rejected without --allow-torch: a
kernel the source defines but never runs is not a kernel of its own."""
import torch
import torch.nn as nn
import triton
import triton.language as tl

EXPECT = r"own kernel: no kernel of the row's own ran"
KIND = "own_kernel"
DEVICES = ("cuda",)
NEEDS = ("triton",)


@triton.jit
def _softmax_rows_decoy(x_ptr, y_ptr, cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    x = tl.load(x_ptr + row * stride + offs, mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * stride + offs, e / tl.sum(e, axis=0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)
