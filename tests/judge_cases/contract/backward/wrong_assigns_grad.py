"""A backward that writes the weight's gradient into .grad itself (assigning, not adding) and hands autograd none:
right after one backward, wrong when PyTorch would accumulate two (no zero_grad between them). Rejected with
--backward at the second call, whose .grad must hold both calls' gradients; accepted without it."""
import torch
import torch.nn as nn

from _fn import linear_tanh_backward

EXPECT = r"trial 2 .*accumulated.*parameter 'fc.weight'"
KIND = "gradient"
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch", "--backward")


class _Assigns(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b):
        y = torch.tanh(torch.addmm(b, x, w.t()))
        ctx.save_for_backward(x, w, y)
        ctx.weight = w
        return y

    @staticmethod
    def backward(ctx, gy):
        x, w, y = ctx.saved_tensors
        gx, gw, gb = linear_tanh_backward(gy, x, w, y)
        ctx.weight.grad = gw
        return gx, None, gb


class ModelNew(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.fc = nn.Linear(n_in, n_out)

    def forward(self, x):
        return _Assigns.apply(x, self.fc.weight, self.fc.bias)
