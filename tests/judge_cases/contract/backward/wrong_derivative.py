"""tanh's derivative taken as 1 - y instead of 1 - y^2: the forward is right (accepted without --backward), every
gradient is wrong. Rejected with --backward, naming the gradient and its error."""
import torch
import torch.nn as nn

from _fn import linear_tanh_backward

EXPECT = r"trial 1 .*backward .*the gradient of input 0: relL2 .* over budget"
KIND = "gradient"
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch", "--backward")


class _Wrong(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b):
        y = torch.tanh(torch.addmm(b, x, w.t()))
        ctx.save_for_backward(x, w, y)
        return y

    @staticmethod
    def backward(ctx, gy):
        x, w, y = ctx.saved_tensors
        return linear_tanh_backward(gy, x, w, y, dtanh=lambda y: 1 - y)


class ModelNew(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.fc = nn.Linear(n_in, n_out)

    def forward(self, x):
        return _Wrong.apply(x, self.fc.weight, self.fc.bias)
