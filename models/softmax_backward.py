"""The softmax's backward (what autograd runs for KernelBench level1/23 in training): dx = y * (dy - rowsum(dy * y))
for the softmax's output y and an upstream gradient dy, at the forward's shape. A problem of its own so its rungs are
judged and timed like any other; models/softmax.py's ModelNew calls them from its backward."""

import torch
import torch.nn as nn

from harness import Kernel, runs_here

BOUND = "memory"
DEFAULT_VARIANT = "auto"  # ModelNew picks a rung per call (rung() below)
EXPORTS = ("softmax_backward",)  # what every rung's .cu must KP_EXPORT
CLUSTER_MAX_COLS = 16 * 24576  # 2_cluster, 3_bulk: a row's slices of y and dy in the registers of a 16-CTA cluster


class Model(nn.Module):
    """PyTorch's own softmax backward, as autograd calls it."""

    def forward(self, y, dy):
        return torch._softmax_backward_data(dy, y, 1, y.dtype)


batch_size = 4096  # the forward's shape (models/softmax.py)
dim = 393216


# run.py --at test judges here, in place of the benchmark's shape (quick checks, the GPU tests): 64 of the forward's
# rows, each as long (the rung is set by the row's length)
TEST_SIZES = {"batch_size": 64}


def get_inputs():
    return [torch.softmax(torch.rand(batch_size, dim), dim=1), torch.randn(batch_size, dim)]


def get_init_inputs():
    return []


def _aligned(t: torch.Tensor) -> bool:
    return t.data_ptr() % 16 == 0 and (t.size(0) <= 1 or t.stride(0) % 4 == 0)


class ModelNew(nn.Module):
    def __init__(self, variant: str = DEFAULT_VARIANT):
        super().__init__()
        self.variant = variant
        self.clusters = runs_here("softmax_backward", "3_bulk")
        auto = ("3_bulk", "1_tworead") if self.clusters else ("1_tworead",)
        self.kernels = {v: Kernel("softmax_backward", v) for v in (auto if variant == "auto" else [variant])}

    def rung(self, y, dy=None) -> str:
        """The variant this call runs: 3_bulk where its cluster path takes the rows, else 1_tworead (3_bulk's own
        fallback, without its cluster path built)."""
        if self.variant != "auto":
            return self.variant
        cols = y.size(1) if y.dim() == 2 else 0
        fits = (
            self.clusters
            and 0 < cols <= CLUSTER_MAX_COLS
            and cols % 4 == 0
            and _aligned(y)
            and (dy is None or _aligned(dy))
        )
        return "3_bulk" if fits else "1_tworead"

    def forward(self, y, dy):
        if y.dim() == 2 and y.size(1) > 1:
            y = y if y.stride(1) == 1 else y.contiguous()  # kernels take any row stride, need unit-stride rows
            dy = dy if dy.stride(1) == 1 else dy.contiguous()
        dx = torch.empty(y.shape, dtype=y.dtype, device=y.device)
        self.kernels[self.rung(y, dy)].softmax_backward(y, dy, dx)
        return dx


def traffic(y, dy, init=None):
    """Fewest bytes any softmax backward must move: read y and dy once, write dx once."""
    return {"bytes": 3 * y.numel() * y.element_size(), "flops": 0}


def _pair(rows, cols, g, device, scale=1.0, off=0):
    y = torch.softmax(torch.randn(rows, cols, generator=g) * scale, dim=1)
    dy = torch.randn(rows * cols + off, generator=g)[off:].view(rows, cols)
    return [], [y.to(device), dy.to(device)]


def _special(g, device):
    _, (y, dy) = _pair(5, 1031, g, "cpu")
    y[0, 3] = float("nan")  # a NaN in y: NaN row, as PyTorch
    dy[1, 7] = float("inf")  # an Inf in dy: NaN row (inf - inf), as PyTorch
    y[2] = 0.0  # an all-zero row: dx = 0
    return [], [y.to(device), dy.to(device)]


CASES = {
    "one_column": lambda g, d: _pair(37, 1, g, d),
    "odd_cols": lambda g, d: _pair(33, 1001, g, d, scale=5.0),
    "tiny": lambda g, d: _pair(3, 3, g, d),
    "offset1": lambda g, d: _pair(17, 1004, g, d, off=1),  # dy 4 bytes off 16-byte alignment
    "special": _special,
}
