"""A Function whose backward returns no gradient for the bias (None): the bias would never train. Rejected with
--backward naming the parameter; accepted without it."""
import torch
import torch.nn as nn

from _fn import linear_tanh_backward

EXPECT = r"parameter 'fc.bias', which the reference trains, got no gradient"
KIND = "gradient"
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch", "--backward")


class _NoBias(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b):
        y = torch.tanh(torch.addmm(b, x, w.t()))
        ctx.save_for_backward(x, w, y)
        return y

    @staticmethod
    def backward(ctx, gy):
        x, w, y = ctx.saved_tensors
        gx, gw, _ = linear_tanh_backward(gy, x, w, y)
        return gx, gw, None


class ModelNew(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.fc = nn.Linear(n_in, n_out)

    def forward(self, x):
        return _NoBias.apply(x, self.fc.weight, self.fc.bias)
