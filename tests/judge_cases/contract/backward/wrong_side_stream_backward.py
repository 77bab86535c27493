"""A right forward and a right derivative, but the backward computes the input's gradient on a side stream of its
own, after a long step there (a sleep standing for a large side computation), and returns it without making the
caller's stream wait: it lands after the backward pass has returned (right once read after a device-wide sync; the
parameters' gradients, which accumulate from call to call, stay on the caller's stream). Rejected with --backward:
the backward's work escapes the timer, as a forward's would; accepted without it."""
import torch
import torch.nn as nn

from _fn import LinearTanh

EXPECT = r"^escape: .*(outside the timed window|work escaped the timed stream)"
KIND = "escape"
DEVICES = ("cuda",)
FLAGS = ("--allow-torch", "--backward")
_SIDE = []


class _SideStreamLinearTanh(LinearTanh):
    @staticmethod
    def backward(ctx, gy):
        x, w, y = ctx.saved_tensors
        gz = gy * (1 - y * y)
        if not _SIDE:
            _SIDE.append(torch.cuda.Stream())
        side = _SIDE[0]
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(2_000_000)  # about a millisecond of side work before the gradient is written
            gx = gz @ w
        return gx, gz.t() @ x, gz.sum(0)


class ModelNew(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.fc = nn.Linear(n_in, n_out)

    def forward(self, x):
        return _SideStreamLinearTanh.apply(x, self.fc.weight, self.fc.bias)
