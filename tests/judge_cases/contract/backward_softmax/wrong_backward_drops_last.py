"""The same softmax with a backward whose row sum leaves out the last column: off by ~1e-3 relative at the fresh
rows, where no widening applies (rejected with --backward at the first call; accepted without it)."""
import torch
import torch.nn as nn

EXPECT = r"trial 1 .*backward .*over budget"
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch", "--backward")


class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.softmax(x, dim=1)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        y, = ctx.saved_tensors
        return y * (dy - (dy * y)[:, :-1].sum(1, keepdim=True))


class ModelNew(nn.Module):
    def forward(self, x):
        return _Softmax.apply(x)
