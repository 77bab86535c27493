"""KernelBench level2/18: Linear, sum over features, then max / mean / logsumexp / logsumexp over a size-1 dim.

The forward equals x @ W.sum(0) + b.sum() (see the kernel header); ModelNew computes exactly that, with the column
sum cached as a function of (W, b) unless built with cache=False.
"""

import torch
import torch.nn as nn

from harness import DerivedCache, Kernel, check_input, trained

BOUND = "memory"
DEFAULT_VARIANT = ("6_phases", "1_colsum_gemv")  # the first of these that runs on this GPU
EXPORTS = ("colsum_gemv_forward", "gemv_bias")  # what every rung's .cu must KP_EXPORT
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


batch_size = 1024  # the shape family's size (--shapes judges at other batches); the features are the model's
in_features = 8192


# run.py --at test judges here, in place of the benchmark's shape (quick checks, the GPU tests): 128 rows of the
# batch; the features are the model's
TEST_SIZES = {"batch_size": 128}

# The reference's probes (kp.judge.probes) that its checks cannot tell from a right kernel, by precision. Each
# output sums the 6.7e7 products behind a row of the GEMM, and the budget's floor for a reduction that long, the
# error of an honest fp32 kernel summing them in another order (2 u32 sqrt(K) = 9.8e-4), is above what fp16
# arithmetic errs here: the reference in fp16 passed all six benchmark-shape calls at 128x8192 on the CPU. A kernel
# that rounds its inputs to fp16 is accepted in fp32; the verdict's note says so.
WEAK_PROBES = {"fp32": ("the reference in fp16",)}


def get_inputs():
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    return [in_features, 8192]


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, variant: str = "default", cache: bool = True):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.k = Kernel("matmul_sum_max_mean_lse", variant)
        self.cache = cache
        # (W.sum(0), b.sum()) in float64, valid while W and b are unchanged (see harness.DerivedCache)
        self.colsum = DerivedCache(None)

    def forward(self, x):
        # Trained through PyTorch: the backward recomputes the reference's chain with torch's ops
        # (harness.trained); its gradients (x's: dy W.sum(0); W's: x's column sums times dy) are PyTorch's.
        return trained(lambda x, *_: self._kernel(x), _reference, x, self.linear.weight, self.linear.bias)

    def _kernel(self, x):
        check_input(x, "x", self.linear.in_features)
        if x.stride(1) != 1 and x.size(1) > 1:
            x = x.contiguous()  # the kernels want unit-stride rows
        w, b = self.linear.weight, self.linear.bias
        out = torch.empty(x.size(0), 1, device=x.device)
        hit = self.colsum.get(w, b) if self.cache else None
        if hit is not None:
            self.k.gemv_bias(x, hit[0], hit[1], out)
            return out
        wc = w if w.is_contiguous() else w.contiguous()
        f64 = dict(device=w.device, dtype=torch.float64)
        vb = torch.empty(w.size(1) + 1, **f64)  # W.sum(0) and b.sum(), filled by the kernel on the way
        nsm = torch.cuda.get_device_properties(x.device).multi_processor_count
        partial = torch.empty(scratch_doubles(*x.shape, nsm), **f64)
        self.k.colsum_gemv_forward(wc, b if b is not None else w.new_empty(0), x, partial, vb[:-1], vb[-1:], out)
        if self.cache:
            self.colsum.put((vb[:-1], vb[-1:]), w, b)
        return out


def _reference(x, w, b):
    y = torch.nn.functional.linear(x, w, b).sum(dim=1, keepdim=True)
    y = torch.max(y, dim=1, keepdim=True)[0].mean(dim=1, keepdim=True)
    return torch.logsumexp(torch.logsumexp(y, dim=1, keepdim=True), dim=1, keepdim=True)


def scratch_doubles(rows: int, cols: int, nsm: int) -> int:
    """float64 scratch for every rung's uncached forward on x of (rows, cols): 2_inflight's tiles of >= 32 columns x
    rows (also covers the 64-column tiles x (rows + 1) of 4_overlap and 6_phases); 3_rowband's per-SM row partials
    and one column-sum row per band (at most one band per SM, capped at 128 MiB for very wide weights); 5_queue's
    <= 32 unit partials per column (same cap)."""
    return (rows + 1) * (-(-cols // 32) + nsm) + min(max(nsm, 32) * cols, cols + (1 << 24))


def traffic(x, init=None, cache: bool = True):
    """Fewest bytes: x, plus W and b unless their column sum is cached. No FLOP term: memory-bound."""
    m, k = x.shape
    n = (init or get_init_inputs())[1]
    return {"bytes": x.element_size() * (m * k + m + (0 if cache else k * n + n)), "flops": 0}


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
    # wider than one 8192-column panel of 3_rowband's row bands (two panels, the second partial)
    "wide_in_features": lambda g, d: ([9000, 33], [_x(7, 9000, g, d)]),
    # more x rows than a CTA's shared-memory slice holds: 3_rowband's directly loaded remainder rows
    "tall_x": lambda g, d: ([40, 16], [_x(20003, 40, g, d)]),
    # no input features: the output is b.sum() on every row (the tile rungs still launch one CTA to sum b)
    "no_in_features": lambda g, d: ([0, 7], [_x(3, 0, g, d)]),
    "empty_batch": lambda g, d: ([40, 16], [_x(0, 40, g, d)]),
    # 5_queue: 5 column tiles (the last one partial; more tiles than the dot lag), 32 W units of a rounded-up row
    # count, 2 dot row blocks
    "tiles_units_blocks": lambda g, d: ([2100, 9000], [_x(70, 2100, g, d)]),
}
