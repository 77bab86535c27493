"""An output judged against what it must be: the expected output of a call (the float64 reference and the budget from
PyTorch's own error on the same inputs), the verdict on an output, and KernelBench's own allclose, compared in
slices."""

from __future__ import annotations

import dataclasses
import math

import torch

from kp.errors import Rejected
from kp.judge.compare import Budget, compare
from kp.judge.float64 import fp32_only_budget
from kp.lib.numerics import (
    CPU_CHUNK_ELEMS,
    HALF_DTYPES,
    Err,
    all_finite,
    budget_reason,
    dtype_name,
    rel_error,
    unit_roundoff,
)
from kp.judge.reference import _as_list, describe

# A derived input counts only where PyTorch's own fp32 result is a fair answer there: NaN/Inf where the float64
# reference has them, and a relL2 under this (~8,000 fp32 ulps: beyond it fp32 itself cannot compute the problem at
# those values, e.g. a product of 256 numbers near -3, and no fp32 kernel can be asked to).
TORCH_FAIR_MAX = 1e-3  # (in fp16 and bf16: torch_fair_max)


def torch_fair_max(dtype: torch.dtype) -> float:
    """PyTorch's own error above which a derived input is not held against a candidate: TORCH_FAIR_MAX in fp32
    (about 10^4 ulps); in fp16 and bf16 sixteen roundings' worth, 16 u (bf16 6.3e-2, fp16 7.8e-3), since one
    rounding of the output alone is about u / sqrt(3) there."""
    return 16 * unit_roundoff(dtype) if dtype in HALF_DTYPES else TORCH_FAIR_MAX


FEW_ELEMENTS = 16  # an output this small is a few samples of its rounding: one element's cancellation rules its relL2


def rms(t: torch.Tensor) -> float:
    """An output's root-mean-square magnitude, 0 where it is empty or not finite (one reduction, no copy of a
    6 GB output)."""
    if not t.numel():
        return 0.0
    v = float(torch.linalg.vector_norm(t.detach(), dtype=torch.float64)) / t.numel() ** 0.5
    return v if math.isfinite(v) else 0.0


def few_scale(r64: torch.Tensor, bench_rms: float | None) -> float:
    """How much the budget's floor grows for an output of a few elements at a member of the shape family (a batch
    of one): the floor (an honest fp32 sum's rounding, relative to a typical output) is taken against the
    benchmark's RMS output where the member's own is smaller. An honest sequential dot product of 131072 terms
    exceeds 2 u sqrt(K) relative to its own value in 4.7% of single draws (where the sum cancels), and in none of
    400 against the typical magnitude. 1 for a larger output, or at the benchmark itself."""
    if not bench_rms or r64.numel() > FEW_ELEMENTS:
        return 1.0
    own = rms(r64)
    return max(1.0, bench_rms / own) if own > 0 else 1.0


@dataclasses.dataclass
class Expected:
    """What a call must return: per output element the float64 reference and the budget from PyTorch's own fp32
    error on the same inputs (or, for a non-tensor element, the value itself)."""

    is_tuple: bool
    specs: list  # per element: (shape, dtype, device) of PyTorch's fp32 output, or the non-tensor value
    r64: list
    errs: list  # per element: its Budget (PyTorch's own error and the budget made from it), None for a non-tensor

    @classmethod
    def of(
        cls,
        r32,
        r64,
        fp32_only: bool = False,
        k: float = 1.0,
        alts: list = (),
        scale: list | None = None,
        spread: list | None = None,
        grow: float = 1.0,
    ) -> "Expected":
        """fp32_only: r64 is PyTorch's fp32 output itself (no float64 reference could be made); the budget is then
        kp.judge.float64.FP32_ONLY_BUDGET. k: the reduction length behind each output element (the budget's floor).
        alts: PyTorch's fp32 outputs under its other legal algorithms; its own error is the worst of them all.
        scale: at a member of the shape family, each output's RMS magnitude at the benchmark's shape (few_scale);
        spread: there, how far each output of a few elements moves under an honest fp32 kernel's roundings
        (kp.judge.expected.rounding_spread): its budget is at least that. grow: the floor's growth at the
        shifted derived input (kp.judge.parity.shift_growth)."""
        alts = [_as_list(a) for a in alts]
        r32l, r64l = _as_list(r32), _as_list(r64)
        specs, errs = [], []
        for i, (a, b) in enumerate(zip(r32l, r64l)):
            if isinstance(a, torch.Tensor) and fp32_only:
                specs.append((tuple(a.shape), a.dtype, a.device))
                errs.append(Budget.fixed(fp32_only_budget(a.dtype)))
            elif isinstance(a, torch.Tensor):
                e = rel_error(a, b)
                for alt in alts:  # the worst of PyTorch's algorithms, where each stays NaN/Inf-exact
                    ea = rel_error(alt[i], b) if alt[i].shape == a.shape else None
                    if ea is not None and not ea.nonfinite_mismatch:
                        e = Err(max(e.rel_l2, ea.rel_l2), max(e.worst_row, ea.worst_row), e.nonfinite_mismatch)
                specs.append((tuple(a.shape), a.dtype, a.device))
                floor_grows = grow * few_scale(b, scale[i] if scale and i < len(scale) else None)
                errs.append(Budget.of(e, k, a.dtype, floor_grows))  # the floor of the dtype PyTorch returns
            else:
                specs.append(a)
                errs.append(None)
        if spread:
            moved = list(spread) + [None] * (len(errs) - len(spread))
            errs = [b if b is None or not m else b.at_least(Err(m, m, 0)) for b, m in zip(errs, moved)]
        return cls(isinstance(r32, (tuple, list)), specs, r64l, errs)

    def floating(self) -> dict:
        """The float64 outputs a budget holds, by index: what a widener measures the honest roundings' spread of."""
        return {i: t for i, (t, b) in enumerate(zip(self.r64, self.errs)) if b is not None and t.is_floating_point()}

    def finite(self) -> bool:
        return all(all_finite(t) for t in self.r64 if isinstance(t, torch.Tensor) and t.is_floating_point())

    def torch_unfair(self) -> str | None:
        """Why PyTorch's own fp32 result fails this call's check (then a derived input is not held against a
        candidate), or None."""
        for e, spec in zip(self.errs, self.specs):
            if e is None:
                continue
            name = dtype_name(spec[1])
            if e.torch_err.nonfinite_mismatch:
                return (
                    f"PyTorch {name} itself gets {e.torch_err.nonfinite_mismatch} NaN/Inf positions wrong (it "
                    f"overflows)"
                )
            if e.torch_err.rel_l2 > torch_fair_max(spec[1]):
                return f"PyTorch {name} itself is off by relL2 {e.torch_err.rel_l2:.1e}"
        return None


def judge_output(label: str, out, out_type: str, exp: Expected, widen=None) -> dict:
    """Every element of the output against the float64 reference, within its budget (kp.judge.compare); raises
    Rejected. widen: the call's widener (kp.judge.compare.widener over Expected.floating: how far honest roundings
    move each output, by index), asked only where an element is over its budget with its NaN/Inf where the
    reference has them; the result then says so ("widened")."""
    n = len(exp.specs)
    if exp.is_tuple != isinstance(out, tuple) or (exp.is_tuple and len(out) != n):
        want = f"a tuple of {n}" if exp.is_tuple else "one torch.Tensor"
        raise Rejected(f"{label}: output is {out_type}, expected {want}", kind="wrong_shape", check=label)
    outs = list(out) if exp.is_tuple else [out]
    worst = {"rel_l2": 0.0, "worst_row": 0.0, "torch_rel_l2": 0.0, "budget": 0.0}
    widened = False
    for i, (o, spec, b, budget) in enumerate(zip(outs, exp.specs, exp.r64, exp.errs)):
        where = label if not exp.is_tuple else f"{label}: output[{i}]"
        if budget is None:
            if o != spec:
                raise Rejected(f"{where}: {o!r}, the reference gives {spec!r}", kind="wrong_output", check=where)
            continue
        shape, dtype, device = spec
        if type(o) is not torch.Tensor or tuple(o.shape) != shape or o.dtype != dtype or o.device != device:
            raise Rejected(
                f"{where}: output is {o if isinstance(o, str) else describe(o)}, expected "
                f"torch.Tensor {shape} {dtype} {device}",
                kind="wrong_shape",
                check=where,
            )
        c = compare(o, b, budget, (lambda i=i: widen().get(i)) if widen is not None else None)
        if not c.ok:
            raise Rejected(
                budget_reason(where, c.err, c.budget.limit),
                figures=c.figures(where),
                kind="non_finite" if c.err.nonfinite_mismatch else "wrong_output",
            )
        widened = widened or c.widened
        worst = {
            "rel_l2": max(worst["rel_l2"], c.err.rel_l2),
            "worst_row": max(worst["worst_row"], c.err.worst_row),
            "torch_rel_l2": max(worst["torch_rel_l2"], c.budget.torch_err.rel_l2),
            "budget": max(worst["budget"], c.budget.limit.rel_l2),
        }
    return {**worst, "widened": True} if widened else worst


ALLCLOSE_CHUNK = 1 << 26  # elements compared at a time by _allclose: its temporaries stay ~1.5 GB whatever the size
ALLCLOSE_CPU_CHUNK = CPU_CHUNK_ELEMS  # on the host, the error measure's steps (kp.lib.numerics.CPU_CHUNK_ELEMS)


def _allclose(got: list, want: list, tols: list[float]) -> list[str]:
    """Per tolerance, 'pass' or why KernelBench's torch.allclose(atol=rtol=tol) check fails (shape, or the largest
    difference). The difference and the reference's magnitude are taken once for every tolerance; equal values
    (infinities included) are close, a NaN never is, as in torch.allclose. Worked in slices of ALLCLOSE_CHUNK
    elements: whole, a failing 6 GiB fp32 output took ~30 GiB of temporaries (its difference in float64 alone 12 GiB),
    which on an 80 GB card turned a rejected candidate's KernelBench line into the judge's own out-of-memory error."""
    if len(got) != len(want):
        return [f"fail ({len(got)} outputs, expected {len(want)})"] * len(tols)
    out = ["pass"] * len(tols)
    for g, w in zip(got, want):
        if not isinstance(w, torch.Tensor):
            continue
        if not isinstance(g, torch.Tensor) or g.shape != w.shape:
            why = f"fail (output {describe(g) if not isinstance(g, str) else g}, expected {tuple(w.shape)})"
            return [why if o == "pass" else o for o in out]
        if g.dtype != w.dtype:  # torch.allclose raises on mixed dtypes: KernelBench's check fails there
            why = f"fail (output {g.dtype}, expected {w.dtype}: torch.allclose refuses mixed dtypes)"
            return [why if o == "pass" else o for o in out]
        gf, wf = g.to(w.device).reshape(-1), w.reshape(-1)
        close = [True] * len(tols)
        worst = None  # the largest difference (NaN counted as infinite), over the slices
        step = ALLCLOSE_CPU_CHUNK if w.device.type == "cpu" else ALLCLOSE_CHUNK
        for i0 in range(0, wf.numel(), step):
            gc, wc = gf[i0 : i0 + step], wf[i0 : i0 + step]
            d, a = (gc - wc).abs(), wc.abs()
            same, finite = gc == wc, torch.isfinite(d)  # a NaN or infinite difference is close only between equals
            for i, tol in enumerate(tols):
                close[i] = close[i] and bool((same | (finite & (d <= tol + tol * a))).all())
            # as the whole tensor's nan_to_num said it: NaN as inf, inf as the largest float64 (the slice's max is NaN
            # where it holds one: no float64 copy of the slice is needed for it)
            if d.numel():
                worst = max(worst or 0.0, float(d.max().double().nan_to_num(float("inf"))))
            del d, a, same, finite
        for i in range(len(tols)):
            if out[i] == "pass" and not close[i]:
                out[i] = f"fail (max difference {worst or 0.0:.2e})"
    return out


def _out_bytes_hint(pristine: list) -> int:
    """NaN-filled headroom the worker keeps in its allocator: twice the largest input plus 64 MiB (a larger
    request just gets fresh memory, which the allocator does not zero either)."""
    sizes = [x.numel() * x.element_size() for x in pristine if isinstance(x, torch.Tensor)]
    return 2 * max(sizes, default=0) + (64 << 20)
