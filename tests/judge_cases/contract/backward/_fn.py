"""The hand-written autograd.Function the backward cases share: y = tanh(x W^T + b) and its derivative, with hooks
each case bends one way."""
import torch


def linear_tanh_backward(gy, x, w, y, dtanh=lambda y: 1 - y * y):
    gz = gy * dtanh(y)
    return gz @ w, gz.t() @ x, gz.sum(0)


class LinearTanh(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b):
        y = torch.tanh(torch.addmm(b, x, w.t()))
        ctx.save_for_backward(x, w, y)
        return y

    @staticmethod
    def backward(ctx, gy):
        x, w, y = ctx.saved_tensors
        return linear_tanh_backward(gy, x, w, y)
