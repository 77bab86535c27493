"""The Triton row softmax launched on a stream of its own that the caller's stream never waits for: the output is
returned before the kernel is known to have run. Rejected at the escape check: its work is outside the timed
window of the caller's stream."""
import torch
import torch.nn as nn
import triton
import triton.language as tl

EXPECT = r"escape"
KIND = "escape"
DEVICES = ("cuda",)
NEEDS = ("triton",)


@triton.jit
def _softmax_rows_side(x_ptr, y_ptr, cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    x = tl.load(x_ptr + row * stride + offs, mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * stride + offs, e / tl.sum(e, axis=0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.side = None

    def forward(self, x):
        if self.side is None:
            self.side = torch.cuda.Stream()
        x = x.contiguous()
        y = torch.empty_like(x)
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            torch.cuda._sleep(2_000_000)  # long enough to end after the caller's stream has moved on
            _softmax_rows_side[(x.shape[0],)](x, y, x.shape[1], x.stride(0),
                                              BLOCK=triton.next_power_of_2(x.shape[1]))
        return y
