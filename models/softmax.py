"""KernelBench level1/23: row softmax of a 4096 x 393216 float32 matrix."""

import torch
import torch.nn as nn

from harness import HALF_DTYPES, Kernel, runs_here

BOUND = "memory"
DEFAULT_VARIANT = "auto"  # ModelNew picks a rung per call (rung() below)
EXPORTS = ("softmax_forward",)  # what every rung's .cu must KP_EXPORT
# run.py --precision bf16|fp16: x in that dtype (KernelBench's cast). 6_regcluster reads and writes 16-bit rows (fp32
# inside); the other rungs take float32 only.
PRECISIONS = ("fp32", "bf16", "fp16")
# auto: rows of up to REGROW_MAX_COLS columns go to 5_regrow (the row in one CTA's registers), rows that fit a
# 16-CTA cluster's registers and shared-memory tails (16 x (49152 + 4096) floats, less a window's 4 for rows that
# are not a multiple of 4) to 6_regcluster, longer ones that fit a 16-CTA cluster's shared memory to
# 4_persistent, and the rest to 2_online: 4_persistent re-reads what does not fit and then loses to 2_online's two
# plain reads (H200, `bench/softmax/sweep.py`, GB/s: 917504 columns 4_persistent 3,164 vs 2_online 2,626; 1048576
# 2,303 vs 2,644; 2097152 1,741 vs 2,631, where torch.compile moved 2,548). From the H200 sweep (docs/softmax.md):
# at 16384 columns 5_regrow moved 4,210 GB/s vs 2,893 for 6_regcluster; at 65536 6_regcluster 3,930 vs 1,365
# (5_regrow's fallback there is a 3-read kernel). Without clusters (a GPU other than Hopper) rows longer than
# REGROW_MAX_COLS go to 2_online (one read for max and sum together, one for the output).
REGROW_MAX_COLS = 16384
REGCLUSTER_MAX_COLS = 16 * (49152 + 4096 - 4)
PERSISTENT_MAX_COLS = 16 * 57344  # 16 CTAs x 224 KiB: held on chip by 4_persistent on an H100/H200 (227 KiB opt-in)
AUTO_HOPPER = ("5_regrow", "6_regcluster", "4_persistent", "2_online")
AUTO_PORTABLE = ("5_regrow", "2_online")


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=1)


batch_size = 4096  # the shape family's sizes (--shapes judges at other values of these): rows, row length
dim = 393216
# --shapes N judges and times these first: the row lengths of docs/softmax.md's bandwidth sweep, each at the
# benchmark's 6.4 GB of input (the rungs' regimes: one CTA's registers, a cluster's, its shared memory, two reads)
SHAPE_FAMILY = [
    {"batch_size": batch_size * dim // cols, "dim": cols}
    for cols in (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)
]


# run.py --at test judges here, in place of the benchmark's shape (quick checks, the GPU tests): 64 of the benchmark's
# rows, each as long (every rung's regime is set by the row's length)
TEST_SIZES = {"batch_size": 64}


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []


class ModelNew(nn.Module):
    def __init__(self, variant: str = DEFAULT_VARIANT):
        super().__init__()
        self.variant = variant
        self.clusters = runs_here("softmax", "6_regcluster")
        auto = AUTO_HOPPER if self.clusters else AUTO_PORTABLE
        # Kernel() rejects an unknown variant name, or one this GPU cannot run, here, in one line.
        self.kernels = {v: Kernel("softmax", v) for v in (auto if variant == "auto" else [variant])}

    def rung(self, x) -> str:
        """The variant this call runs (run.py shows it next to 'auto')."""
        if self.variant != "auto":
            return self.variant
        if x.dtype in HALF_DTYPES:
            if not self.clusters:
                raise TypeError(
                    f"softmax: {x.dtype} rows run on 6_regcluster, which needs sm_90a (thread-block "
                    f"clusters); on this GPU give float32"
                )
            return "6_regcluster"
        cols = x.size(1) if x.dim() == 2 else 0
        if cols <= REGROW_MAX_COLS:
            return "5_regrow"
        if not self.clusters:
            return "2_online"
        if cols <= REGCLUSTER_MAX_COLS:
            return "6_regcluster"
        return "4_persistent" if cols <= PERSISTENT_MAX_COLS else "2_online"

    def forward(self, x):
        if torch.is_grad_enabled() and x.requires_grad:  # training: the backward is the playground's own kernel
            return _Softmax.apply(x, self)
        return self._forward(x)

    def _forward(self, x):
        if x.dim() == 2 and x.size(1) > 1 and x.stride(1) != 1:
            x = x.contiguous()  # kernels take any row stride and offset, but need unit-stride rows
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        self.kernels[self.rung(x)].softmax_forward(x, y)
        return y

    def backward_model(self):
        """The backward's rungs (models/softmax_backward.py), built at the first backward: a forward-only user
        never compiles them."""
        if "_backward" not in self.__dict__:  # held aside: no module of the state_dict, nothing to move
            from models.softmax_backward import ModelNew as Backward

            self.__dict__["_backward"] = Backward()
        return self.__dict__["_backward"]


class _Softmax(torch.autograd.Function):
    """The forward kernel, and dx = y * (dy - rowsum(dy * y)) by softmax_backward's rungs (float32; a 16-bit y
    takes PyTorch's backward, which those rungs do not read)."""

    @staticmethod
    def forward(ctx, x, model):
        y = model._forward(x)
        ctx.save_for_backward(y)
        ctx.model = model
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        if y.dtype != torch.float32:
            return torch._softmax_backward_data(dy, y, 1, y.dtype), None
        return ctx.model.backward_model()(y, dy), None


def traffic(x, init=None):
    """Fewest bytes any softmax must move: read x once, write y once. No FLOP term: memory-bound."""
    return {"bytes": 2 * x.numel() * x.element_size(), "flops": 0}


def _offset(rows, cols, off, g, device):
    base = torch.rand(rows * cols + off, generator=g).to(device)
    return [], [base[off:].view(rows, cols)]  # storage offset `off` floats: breaks 16-byte alignment


def _special(g, device):
    x = torch.randn(9, 1031, generator=g) * 30
    x[0, ::7] = float("-inf")  # some -inf entries
    x[1] = float("-inf")  # all -inf: NaN row, as PyTorch
    x[2, 5] = float("nan")  # a NaN: NaN row
    x[3, 1000] = float("inf")  # +inf: NaN row
    x[4] = torch.linspace(-1e30, 1e30, 1031)  # huge magnitudes: exact one-hot-ish row
    x[5, :3] = 1e30
    x[6] = -1e30
    x[7, 1030] = float("nan")
    x[7, :1030] = float("-inf")  # -inf then NaN in the tail scalar slot
    return [], [x.to(device)]


# Small odd cases: name -> fn(generator, device) -> (init inputs, forward inputs). The large case is the benchmark
# shape itself.
CASES = {
    "one_column": lambda g, d: ([], [torch.rand(37, 1, generator=g).to(d)]),
    "one_row_odd": lambda g, d: ([], [torch.rand(1, 12347, generator=g).to(d)]),
    "odd_cols": lambda g, d: ([], [torch.randn(33, 1001, generator=g).to(d) * 5]),
    "tiny": lambda g, d: ([], [torch.rand(3, 3, generator=g).to(d)]),
    "offset1": lambda g, d: _offset(17, 1003, 1, g, d),
    "offset2_aligned_rows": lambda g, d: _offset(5, 4096, 2, g, d),
    "offset3_long": lambda g, d: _offset(3, 100003, 3, g, d),
    "transposed": lambda g, d: ([], [torch.rand(301, 130, generator=g).to(d).t()]),
    "row_strided": lambda g, d: ([], [torch.rand(64, 2052, generator=g).to(d)[:, 3:2049]]),
    "long_rows": lambda g, d: ([], [torch.rand(6, 393216 + 5, generator=g).to(d)]),
    "very_long_rows": lambda g, d: ([], [torch.randn(2, 1 << 20, generator=g).to(d)]),
    "special_values": _special,
    # 4-CTA clusters whose slices run past the registers into a shared-memory tail, more rows than 2 x 33 resident
    # clusters (6_regcluster's ticketed row order on a 132-SM GPU); and 3-CTA clusters with the TMA prefetch
    "many_cluster_rows": lambda g, d: ([], [torch.randn(70, 196612, generator=g).to(d)]),
    "three_cta_clusters": lambda g, d: ([], [torch.randn(5, 131072, generator=g).to(d)]),
    # rows that are not a multiple of 4 floats (each starts in another phase mod 16 bytes: 6_regcluster's window
    # path) in tailed 4-CTA clusters, more rows than 2 x 33 resident clusters; in 8-CTA clusters without a tail
    "odd_cluster_rows": lambda g, d: ([], [torch.randn(70, 196613, generator=g).to(d)]),
    "odd_eight_cta_rows": lambda g, d: ([], [torch.randn(5, 262147, generator=g).to(d)]),
    # a row a few floats short of two full slices, not a multiple of 4: its window needs 3-CTA clusters (a window
    # takes a tail only where that halves the cluster)
    "window_past_a_full_slice": lambda g, d: ([], [torch.randn(5, 98303, generator=g).to(d)]),
    # tails in one-CTA "clusters" with more rows than 2 x 132 resident ones, and in 16-CTA clusters (rows that
    # were too long for 16 register slices)
    "tail_one_cta_rows": lambda g, d: ([], [torch.randn(300, 50000, generator=g).to(d)]),
    "tail_sixteen_cta_rows": lambda g, d: ([], [torch.randn(3, 786440, generator=g).to(d)]),
}
