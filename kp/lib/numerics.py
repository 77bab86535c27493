"""Numerics: relative L2 error against a float64 reference (overall and per row), bitwise equality through views,
the error budget, and layout-keeping copies of inputs."""

from __future__ import annotations

import dataclasses

import torch

# ---------------------------------------------------------------------------------------------------------------
# Numerics.


@dataclasses.dataclass
class Err:
    rel_l2: float  # ||out - ref|| / ||ref|| over elements where both are finite
    worst_row: float  # max over rows of the same (row ops); equals rel_l2 for non-row outputs
    nonfinite_mismatch: int  # positions where NaN/±Inf patterns differ

    def within(self, budget: "Err") -> bool:
        return self.nonfinite_mismatch == 0 and self.rel_l2 <= budget.rel_l2 and self.worst_row <= budget.worst_row


# elements per step of the error measure (256 MiB in float64): large outputs never need a full float64 copy on the
# device
CHUNK_ELEMS = 1 << 25
# on the host: steps of 32 MiB in float64. Much smaller steps are as fast alone, but each operator is a parallel region
# and judges sharing the cores wait at every one (the suite's CPU known-wrong cases on 2 cores: 78 s before, 200 s in
# steps of 2^18, 52 s in these)
CPU_CHUNK_ELEMS = 1 << 22


def chunk_for(device: torch.device) -> int:
    """Elements per step of a measure worked in slices: large on a GPU (few launches and syncs), smaller on the
    host."""
    return CPU_CHUNK_ELEMS if torch.device(device).type == "cpu" else CHUNK_ELEMS


def as_rows(t: torch.Tensor) -> torch.Tensor:
    """The rows the worst-row error is taken over: slices along the last dimension of size above one (a column
    vector (M, 1) is one row of M, not M rows of one element, whose relative errors mean nothing near zero; a 1-D
    or 0-D tensor is one row)."""
    shape = list(t.shape)
    while len(shape) > 1 and shape[-1] == 1:
        shape.pop()
    if len(shape) <= 1:
        return t.reshape(1, -1)
    return t.reshape(-1, shape[-1])


def row_resolution(dtype: torch.dtype) -> float:
    """How small a row is still measured against its own size, relative to the typical row: below it, against this
    size of the typical row. An error of one rounding of the typical row (u times it: all the dtype resolves there)
    is then exactly the least budget (dtype_floor). With u alone (2^-24 in fp32) a row was measured a budget's
    factor finer than that: an honest fp32 Mish (log(1 + exp(x)), whose tail near x = -12 keeps a few bits), 1/50 of
    an ulp of its typical row off in a row of tail values, was rejected at 2.2e-2 against a row budget of 2.1e-5."""
    if not dtype.is_floating_point or dtype == torch.float64:
        dtype = torch.float32
    return min(1.0, unit_roundoff(dtype) / dtype_floor(dtype))


def rel_error(out: torch.Tensor, ref: torch.Tensor, chunk: int | None = None) -> Err:
    """Relative L2 error of `out` against a float64 `ref` (which may live on the host while `out` is on the GPU).
    Non-finite values must match exactly (NaN where the reference has NaN, the same infinities); they are then
    excluded from the L2 norms. Worked in blocks of rows and columns moved to out's device, so the peak extra memory
    is a few chunks, not a float64 copy of the output."""
    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"shapes differ: {tuple(out.shape)} vs {tuple(ref.shape)}")
    if out.numel() == 0:
        return Err(0.0, 0.0, 0)
    o2, r2 = as_rows(out.detach()), as_rows(ref.detach())
    dev = out.device
    # Below the dtype's smallest normal number (fp32: 1.2e-38) a value keeps fewer bits the smaller it is, and a
    # product or a sum that passes through there loses them in an order-dependent way: an output (or a row) whose
    # values all lie there is measured against that size, not its own. A product of 256 normals (KernelBench's
    # l1_p50) lies there whole: 2e-45 to 3e-40, an honest sequential product and PyTorch's differing by up to 100%.
    tiny = torch.finfo(out.dtype).tiny if out.dtype.is_floating_point else 0.0
    resolution = row_resolution(out.dtype)
    chunk = chunk or chunk_for(dev)
    rows, cols = o2.shape
    cstep = max(1, min(cols, chunk))
    rstep = max(1, chunk // cstep)
    num2 = torch.zeros((), dtype=torch.float64, device=dev)
    den2 = torch.zeros((), dtype=torch.float64, device=dev)
    mism = torch.zeros((), dtype=torch.int64, device=dev)
    worst = torch.zeros((), dtype=torch.float64, device=dev)
    for r0 in range(0, rows, rstep):
        rn = torch.zeros(min(rstep, rows - r0), dtype=torch.float64, device=dev)
        rd = torch.zeros_like(rn)
        for c0 in range(0, cols, cstep):
            o = o2[r0 : r0 + rstep, c0 : c0 + cstep]
            if o.dtype == torch.bool or o.is_complex():  # as the reference is taken: a mask's values as
                o = o.to(torch.float64)  # numbers (torch subtracts no bool tensor), a complex output's real part
            r = r2[r0 : r0 + rstep, c0 : c0 + cstep].to(dev, torch.float64)
            # one float64 temporary (the difference, promoted as it is taken) and two norms that square as they
            # reduce: few passes and few operators a step (each a parallel region on the host, where judges
            # sharing cores wait at every one). A 2-core host, 1024 x 393216: 5.9 s with the output's float64
            # copy, the difference and both squares as temporaries, 1.4-1.6 s now
            dn = torch.linalg.vector_norm(r - o, dim=1).square()
            dd = torch.linalg.vector_norm(r, dim=1).square()
            # no NaN or Inf on either side (one would carry into the sums): the three masks below change nothing
            if bool(torch.isfinite(dn.sum() + dd.sum())):
                rn += dn
                rd += dd
                continue
            o = o.to(torch.float64)
            nan_o, nan_r = torch.isnan(o), torch.isnan(r)
            inf_o, inf_r = torch.isinf(o), torch.isinf(r)
            mism += ((nan_o != nan_r) | (inf_o != inf_r) | (inf_r & (o != r))).sum()
            fin = torch.isfinite(r) & torch.isfinite(o)
            d = torch.where(fin, o - r, 0.0)
            rr = torch.where(fin, r, 0.0)
            rn += (d * d).sum(1)
            rd += (rr * rr).sum(1)
        num2 += rn.sum()
        den2 += rd.sum()
        # A row is not measured finer than the output's dtype resolves its typical row (its block's mean,
        # row_resolution): a row of values at 1e-40 beside rows at 1e2 (a Mish whose input was scaled x100,
        # underflowed to zero by one formula and kept as a denormal by another) has no error worth the name, while
        # a wrong row of the typical size, or garbage where the reference is zero, stays far over any budget.
        floor = resolution**2 * rd.mean()
        floor = torch.where(floor > 0, torch.clamp_min(floor, cols * tiny**2), floor)  # zeros: as they are
        per_row = torch.where(
            torch.maximum(rd, floor) > 0,
            (rn / torch.maximum(rd, floor).clamp_min(torch.finfo(torch.float64).tiny)).sqrt(),
            rn.sqrt(),
        )
        worst = torch.maximum(worst, per_row.max())
    num, den = float(num2.sqrt()), float(den2.sqrt())
    den = max(den, o2.numel() ** 0.5 * tiny) if den > 0 else den  # a reference of zeros: the error as it is
    rl2 = num / den if den > 0 else num
    return Err(rl2, float(worst) if rows > 1 else rl2, int(mism))


def all_finite(t: torch.Tensor, chunk: int | None = None) -> bool:
    """No NaN or infinity in `t`: in steps (no mask of the whole tensor: on the host a 3 GiB float64 output took 3 s
    whole, its 400 MB mask fresh pages), ending at the first step with one."""
    if not t.is_floating_point() and not t.is_complex():
        return True
    flat = t.reshape(-1)
    chunk = chunk or chunk_for(t.device)
    return all(bool(torch.isfinite(flat[i : i + chunk]).all()) for i in range(0, flat.numel(), chunk))


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def same_values(a: torch.Tensor, b: torch.Tensor, chunk: int | None = None) -> bool:
    """Bitwise-equal values through the views (NaN equals NaN, the sign of zero counts; what lies outside the views
    is not compared). `b` may live on another device than `a`; compared in chunks on a's device."""
    if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
        return False
    chunk = chunk or chunk_for(a.device)
    fa, fb = a.reshape(-1), b.reshape(-1)
    bits = _SAME_SIZE_INT.get(a.element_size()) if a.is_floating_point() else None
    for i in range(0, fa.numel(), chunk):
        x, y = fa[i : i + chunk], fb[i : i + chunk].to(a.device)
        if bits is not None and torch.equal(x.view(bits), y.view(bits)):
            continue  # the same bits: equal values (the usual case, in one pass); else NaNs may differ in payload
        if a.is_floating_point():
            if not bool(((x == y) | (torch.isnan(x) & torch.isnan(y))).all()):
                return False
            if not bool((torch.signbit(x) == torch.signbit(y)).all()):
                return False
        elif not torch.equal(x, y):
            return False
    return True


# measured on an H200: PyTorch-fp32's own relL2 can be ~1e-9 on fresh modules, so a pure multiple is meaningless there;
# 1e-6 is ~1/10 of a single-ulp-everywhere error in fp32 (1.2e-7 * ~8).
ABS_FLOOR = 1e-6
REF_MULTIPLE = 4.0  # candidates may be up to 4x PyTorch-fp32's own error on the same inputs
# A straightforward fp32 implementation sums each output's K terms one after another: its rounding errors add up
# like a random walk, to about u * sqrt(K) relative (u = 2^-24), where PyTorch's blocked GEMM/conv and pairwise
# reductions stay near u. Such an honest fp32 kernel must not fail for summing in order, so the floor grows with
# the reduction length K: 2 u sqrt(K) (K = 4096: 7.6e-6; K = 131072: 4.3e-5). Precision shortcuts stay far above
# it (TF32 products ~1e-4 to 1e-3, fp16/bf16 storage or accumulation 1e-4 to 1e-2).
ACCUMULATION_FACTOR = 2.0
FP32_UNIT_ROUNDOFF = 2.0**-24


# The judged precisions and the dtype each runs the reference, its inputs and weights and the candidate in. fp32 and
# tf32 keep the file's own dtypes; bf16 and fp16 cast every floating input, weight and buffer (KernelBench's rule:
# `Model.to(dtype)`, BatchNorm's running statistics included) and judge the output, in that dtype, against the
# float64 reference computed from the same cast values.
PRECISION_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
HALF = ("bf16", "fp16")
HALF_DTYPES = (torch.bfloat16, torch.float16)


def precision_dtype(precision: str) -> torch.dtype:
    return PRECISION_DTYPES[precision]


def dtype_name(dtype: torch.dtype) -> str:
    """The judged precision's name of a dtype ('bf16'; float32 is 'fp32'), or torch's name for any other."""
    return next((k for k, v in PRECISION_DTYPES.items() if v == dtype), str(dtype).replace("torch.", ""))


def unit_roundoff(dtype: torch.dtype) -> float:
    """u: the largest relative error of one rounding to nearest in dtype (2^-24 fp32, 2^-11 fp16, 2^-8 bf16)."""
    return torch.finfo(dtype).eps / 2


def dtype_floor(dtype: torch.dtype = torch.float32) -> float:
    """The least budget in a dtype: ABS_FLOOR in fp32; in fp16 and bf16 one rounding of every output element, u
    (a kernel that computes in fp32 and rounds its output once differs from PyTorch's own by up to that where
    PyTorch's error is zero, e.g. an exactly representable ReLU)."""
    return unit_roundoff(dtype) if dtype in HALF_DTYPES else ABS_FLOOR  # fp32, fp64, integer outputs: ABS_FLOOR


def accumulation_floor(k: float, dtype: torch.dtype = torch.float32) -> float:
    """The budget's floor for a reduction of length k. Half-precision kernels are held to fp32 accumulation, as
    PyTorch's own are (its bf16/fp16 GEMMs, convolutions and reductions accumulate in fp32): the sqrt(K) term keeps
    fp32's u, and only the dtype's own rounding of the output is added (dtype_floor)."""
    return max(dtype_floor(dtype), ACCUMULATION_FACTOR * FP32_UNIT_ROUNDOFF * max(k, 1.0) ** 0.5)


def cast_floats(xs, dtype: torch.dtype | None):
    """Inputs with every floating tensor cast to dtype (None: as they are); other values as they are."""
    if dtype is None:
        return xs
    return [x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in xs]


def budget_reason(label: str, err: Err, budget: Err) -> str:
    """Why an output is over its budget, on one line, for a person (the figures travel beside it: error_figures)."""
    if err.nonfinite_mismatch:
        return (
            f"{label}: {err.nonfinite_mismatch} NaN/Inf positions differ from the reference (an overflow, "
            f"or elements never written: the judge's output memory reads as NaN until written)"
        )
    if err.rel_l2 <= budget.rel_l2:  # the whole output within its budget, one row not: the row is named first
        return (
            f"{label}: worst row {err.worst_row:.2e} over budget {budget.worst_row:.2e} (relL2 "
            f"{err.rel_l2:.2e}, within its budget {budget.rel_l2:.2e})"
        )
    return (
        f"{label}: relL2 {err.rel_l2:.2e} over budget {budget.rel_l2:.2e} (worst row {err.worst_row:.2e}, "
        f"row budget {budget.worst_row:.2e})"
    )


def budget_from(ref_err: Err, k: float = 1.0, dtype: torch.dtype = torch.float32, grow: float = 1.0) -> Err:
    """The budget: REF_MULTIPLE x PyTorch's own error in the judged dtype, at least the floor for a reduction of
    length k in that dtype (times `grow`: an output of a few elements smaller than it typically is,
    kp.judge.outputs.few_scale)."""
    floor = accumulation_floor(k, dtype) * grow
    return Err(max(REF_MULTIPLE * ref_err.rel_l2, floor), max(REF_MULTIPLE * ref_err.worst_row, floor), 0)


# ---------------------------------------------------------------------------------------------------------------
# Inputs.


def clone_layout(x):
    """A copy that keeps shape, strides and storage offset (plain .clone() drops the offset)."""
    if not isinstance(x, torch.Tensor):
        return x
    n = x.untyped_storage().nbytes() // x.element_size()
    buf = torch.empty(n, dtype=x.dtype, device=x.device)
    view = buf.as_strided(x.shape, x.stride(), x.storage_offset())
    view.copy_(x)
    return view


def cpu_kernels() -> tuple[str, int]:
    """Which of PyTorch's CPU kernels this process runs: its vector instruction set (picked at import from what the
    machine says of its CPU, or from ATEN_CPU_CAPABILITY) and its thread count. Two processes that differ here may
    round one operator differently."""
    return torch.backends.cpu.get_cpu_capability(), torch.get_num_threads()


def batch_rows(xs: list) -> int:
    """The batch size the tensors of a call share along dim 0, or 0 where they share none (or hold none)."""
    sizes = {x.shape[0] for x in xs if isinstance(x, torch.Tensor) and x.dim() > 0}
    return sizes.pop() if len(sizes) == 1 else 0
