"""KernelBench level2/18: Linear, sum over features, then max / mean / logsumexp / logsumexp over a size-1 dim.

The forward equals x @ W.sum(0) + b.sum() (see the kernel header); ModelNew computes exactly that, with the column
sum cached as a function of (W, b) unless built with cache=False.
"""
import torch
import torch.nn as nn

from harness import DerivedCache, Kernel, check_input

BOUND = "memory"
DEFAULT_VARIANT = "1_colsum_gemv"
# Extra rows of the run.py table: the same variant built with these ModelNew options.
ROW_OPTIONS = {"cache=False": {"cache": False}}


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        x = self.linear(x)
        x = torch.sum(x, dim=1, keepdim=True)
        x = torch.max(x, dim=1, keepdim=True)[0]
        x = torch.mean(x, dim=1, keepdim=True)
        x = torch.logsumexp(x, dim=1, keepdim=True)
        x = torch.logsumexp(x, dim=1, keepdim=True)
        return x


def get_inputs():
    return [torch.rand(1024, 8192)]


def get_init_inputs():
    return [8192, 8192]


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, variant: str = DEFAULT_VARIANT, cache: bool = True):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.k = Kernel("matmul_sum_max_mean_lse", variant)
        self.cache = cache
        self.colsum = DerivedCache(self._colsum)  # (W.sum(0), b.sum()), recomputed when W or b changes

    def _colsum(self, w, b):
        w = w if w.is_contiguous() else w.contiguous()
        f64 = dict(device=w.device, dtype=torch.float64)  # sums in float64 (see the kernel header)
        v = torch.empty(w.size(1) + 1, **f64)  # v and bsum in one allocation
        partial = torch.empty(-(-w.size(0) // 64) * w.size(1), **f64)
        self.k.colsum(w, b if b is not None else w.new_empty(0), partial, v[:-1], v[-1:])
        return v[:-1], v[-1:]

    def forward(self, x):
        check_input(x, "x", self.linear.in_features)
        if x.stride(1) != 1 and x.size(1) > 1:
            x = x.contiguous()  # the GEMV wants unit-stride rows
        w, b = self.linear.weight, self.linear.bias
        v, bsum = self.colsum(w, b) if self.cache else self._colsum(w, b)
        out = torch.empty(x.size(0), 1, device=x.device)
        self.k.gemv_bias(x, v, bsum, out)
        return out


def traffic(x, init=None, cache: bool = True):
    """Fewest bytes: x, plus W and b unless their column sum is cached. No FLOP term: memory-bound."""
    m, k = x.shape
    n = (init or get_init_inputs())[1]
    return {"bytes": 4 * (m * k + m + (0 if cache else k * n + n)), "flops": 0}


def _x(rows, cols, g, d):
    return torch.rand(rows, cols, generator=g).to(d)


def _offset_x(rows, cols, g, d):
    base = torch.rand(rows * cols + 1, generator=g).to(d)
    return base[1:].view(rows, cols)


CASES = {
    "odd_small": lambda g, d: ([37, 53], [_x(5, 37, g, d)]),
    "batch1": lambda g, d: ([64, 100], [_x(1, 64, g, d)]),
    "features_not_mult4": lambda g, d: ([1030, 1031], [_x(17, 1030, g, d)]),
    "transposed_x": lambda g, d: ([96, 200], [_x(96, 33, g, d).t()]),
    "offset_x": lambda g, d: ([129, 77], [_offset_x(9, 129, g, d)]),
    "many_out_features": lambda g, d: ([40, 5000], [_x(3, 40, g, d)]),
}
