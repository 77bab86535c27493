"""The judge: one set of stages for the playground's own variants and for anybody's ModelNew, against any
KernelBench-format reference (a file with ``Model``, ``get_inputs()``, ``get_init_inputs()``; the built-in problems
under models/ are such files with optional extras: declared ``CASES``, ``traffic``, ``BOUND``, ``PRECISIONS``).

This process owns the inputs, the fp32 and float64 references, every comparison and the verdict. The models being
judged live in a *runner*: for a candidate file, a worker process of its own that imports it (so it cannot patch the
comparisons; the worker fingerprints the torch/time namespaces and reports any change); for the playground's own
variants, the same Worker class called in this process. Either way the same commands run in the same order.

Stages (a failure rejects that row with a one-line reason, ``rejected: <stage>: <reason>``):
 1. construct: ``ModelNew(*get_init_inputs())`` after the reference's seed; the reference's state_dict is loaded
    into it (by name, or in order where names differ but shapes line up).
 2. parity, one stateful sequence of calls on benchmark-shape inputs: ``trials`` calls on fresh inputs, with the
    weights changed between them the ways training does (an optimizer step on random gradients, a
    ``load_state_dict`` of new values, an in-place edit), then derived inputs (negated, x100, shifted) where the
    float64 reference stays finite; then every declared case on a fresh model. Per call: the allocator's cached
    free memory is NaN-filled, the candidate runs on its own copy, its inputs are compared bit for bit afterwards,
    every output element is compared with the float64 reference (relL2 overall and worst row within
    max(4 x PyTorch's own error in the chosen precision, 1e-6); NaN/Inf positions must match), then buffers
    (BatchNorm running statistics) are compared with the reference's.
 3. escape: one call inside a profiler window bounded by marker kernels; any GPU work outside it, or a host clock
    that sees more than the events, rejects.
 4. own kernel: the profiled call must run a kernel from a shared object the row loaded (its load_inline build or
    the playground's kernel cache), unless ``allow_torch`` (the row is then labelled pure PyTorch).
 5. timing: eager, torch.compile and every row interleaved (kp.timing.bench_interleaved), every call on inputs
    drawn just before it from an OS seed, after one more weight change; after each timed call the judge decides
    whether to check it (one per row at a secret rep, perhaps one more at random), outside the timed region and
    after a device-wide synchronize; the samples are told here call by call, reduced here and bounded by the wall
    time this process saw.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import time
from pathlib import Path

import torch

from kp.boxstart import candidate_build_dir, candidate_paths
from kp.build import progress
from kp.errors import Rejected, UsageError
from kp.layers import PRECISIONS, set_precision
from kp.numerics import ReductionLength, budget_from, clone_layout, reduction_length, rel_error, same_values
from kp.errors import first_line
from kp.float64 import FP32_ONLY_BUDGET, Promote, as_float64, float64_copy, float64_default
from kp.numerics import Err
from kp.premises import Premises
from kp.reference import (UPDATES, Reference, _as_list, apply_update, describe, make_update, partial_map,
                          rename_update, state_map, trial_seeds, unmapped)
from kp.registry import picks_per_call, runnable_variants, variant_factory
from kp.timing import copy_bandwidth, gemm_rates, gpu_to_itself
from kp.profile import kernel_base_name
from kp.worker import (JOB_TIMEOUT_S, LocalRunner, ProcessRunner, escape_threshold_ms, host_clock_excess_ms,
                       window_violations)

MIN_TRIALS = 3
# Inputs derived from the benchmark inputs (floating tensors only): a kernel that is right only for torch.rand's
# [0, 1) fails one of them (e.g. a softmax without the max subtraction overflows at x100).
DERIVED = {"negated": lambda x: -x, "scaled x100": lambda x: x * 100, "shifted -3": lambda x: x - 3}
FLOAT64_ON_DEVICE_MAX = 512 << 20  # problems up to this footprint get their float64 reference on the GPU; larger
#                                     ones on the host (a full float64 copy would not fit ~3x the footprint)
MEMORY_FACTOR = 3  # the judge's peak GPU memory target: this many times the problem's inputs + outputs + weights
CPU_BENCH_MAX = 256 << 20  # on --device cpu, benchmark-shape calls run only when inputs + outputs are this small
HOST_PEAK_FACTOR = 3  # ... and when this many times the forward's fp32 peak (LivePeak) fits the available host memory
# A derived input counts only where PyTorch's own fp32 result is a fair answer there: NaN/Inf where the float64
# reference has them, and a relL2 under this (~8,000 fp32 ulps: beyond it fp32 itself cannot compute the problem at
# those values, e.g. a product of 256 numbers near -3, and no fp32 kernel can be asked to).
TORCH_FAIR_MAX = 1e-3
MODES = ("train", "eval")
# Timed calls checked per row: one at a secret rep below the least reps, and at random at most this many more (each
# check of a large problem computes a float64 reference: two in all is what the judge paid before the draw moved here)
MAX_TIMED_CHECKS = 1
EXTRA_CHECK_P = 0.05
# A median below this fraction of reading the inputs once at copy speed is impossible, whatever the kernel: generous,
# since part of an input may rightly go unread (a triangular operand's zero half, an index that selects little).
INPUT_FLOOR_FRACTION = 0.25
FLOOR_MIN_MS = 0.005  # floors shorter than this are within the events' own resolution: not judged
ESCAPE_RETRIES = 2  # further tries of the escape check when only the host clock objects (each ~5 calls)
KERNELBENCH_TRIALS = 5  # KernelBench's own correctness check: same-seed models, 5 draws, torch.allclose
KERNELBENCH_TOLS = ("1e-4", "1e-2")  # atol = rtol for fp32 now, and in the v0/v0.1 era of its leaderboard

# ---------------------------------------------------------------------------------------------------------------
# The judge.

def budget_reason(label: str, err, budget) -> str:
    if err.nonfinite_mismatch:
        return (f"{label}: {err.nonfinite_mismatch} NaN/Inf positions differ from the reference (an overflow, "
                f"or elements never written: the judge's output memory reads as NaN until written)")
    return (f"{label}: relL2 {err.rel_l2:.2e} (worst row {err.worst_row:.2e}) over budget {budget.rel_l2:.2e} "
            f"({budget.worst_row:.2e})")


def host_available() -> int:
    """Bytes of host memory available now (MemAvailable), or all of it where that cannot be read."""
    try:
        for ln in Path("/proc/meminfo").read_text().splitlines():
            if ln.startswith("MemAvailable:"):
                return int(ln.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def cpu_bench_refusal(fp: dict, available: int) -> str | None:
    """Why the benchmark shape is not run on the CPU (inputs and outputs over CPU_BENCH_MAX, or a forward whose
    intermediates would not fit the host: HOST_PEAK_FACTOR x its fp32 peak, for the float64 copy and the fp32 runs),
    or None."""
    io = fp["inputs"] + fp["outputs"]
    if io > CPU_BENCH_MAX:
        return f"the benchmark shape ({io / 2**20:,.0f} MiB) was not run on the CPU"
    need = HOST_PEAK_FACTOR * fp.get("peak", 0)
    if need > available:
        return (f"the benchmark shape was not run on the CPU: its forward holds {fp['peak'] / 2**30:.1f} GiB at its "
                f"peak (intermediates), about {need / 2**30:.0f} GiB with the float64 reference, and "
                f"{available / 2**30:.0f} GiB of host memory are available")
    return None


def free_gpu_bytes() -> int:
    return torch.cuda.mem_get_info()[0]


def memory_need(fp: dict, models: int) -> int:
    """GPU bytes the judge plans for: MEMORY_FACTOR x the problem's inputs, outputs and weights (the model's copy of
    the inputs, its output, PyTorch's output, the timing pool, the references' weights), plus one copy of the
    weights for each judged model beyond the first (every row is alive while rows are timed side by side)."""
    return MEMORY_FACTOR * (fp["inputs"] + fp["outputs"] + fp["weights"]) + max(models - 1, 0) * fp["weights"]


def check_memory(name: str, fp: dict, models: int, free: int) -> None:
    """One line before any work when the judge would not fit."""
    need = memory_need(fp, models)
    fbytes = fp["inputs"] + fp["outputs"] + fp["weights"]
    if need > free:
        raise UsageError(f"{name} needs about {need / 2**30:.1f} GiB of GPU memory ({MEMORY_FACTOR} x "
                         f"{fbytes / 2**30:.1f} GiB of inputs, outputs and weights"
                         + (f", and the weights of {models} models" if models > 1 and fp["weights"] else "")
                         + f"); {free / 2**30:.1f} GiB are free")


@dataclasses.dataclass
class Row:
    label: str
    runner: object
    peer: bool = False  # somebody else's code (e.g. a Triton GEMM): measured and shown, a failure is not ours
    opts: dict = dataclasses.field(default_factory=dict)
    accepted: bool = True
    reason: str = ""
    checks: dict = dataclasses.field(default_factory=dict)
    names: dict | None = None  # reference state_dict key -> this row's key
    pure_torch: bool = False
    path: str | None = None  # the candidate file
    own_kernels: dict | None = None
    kernels: list | None = None
    escape: dict | None = None
    variant: str | None = None  # the built-in rung a row runs (its label may carry options: "v[cache=False]")
    weights: str | None = None  # how the reference's weights reached the row, when not whole (same-seed contract)
    kernelbench: dict | None = None  # KernelBench's own correctness check on the same candidate: tolerance -> verdict

    def reject(self, reason: str) -> None:
        if self.accepted:
            self.accepted, self.reason = False, reason


FLOAT64, PROMOTED = "float64", "float64, every torch op's floating arguments promoted"


def _same_buffer(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))


def _unread_counter(model: torch.nn.Module, key: str) -> bool:
    """True for a BatchNorm's num_batches_tracked when its momentum is set: PyTorch reads the counter only for a
    cumulative average (momentum None), so a candidate that does not keep it computes the same."""
    owner, _, name = key.rpartition(".")
    try:
        m = model.get_submodule(owner) if owner else model
    except AttributeError:
        return False
    return name == "num_batches_tracked" and isinstance(m, torch.nn.modules.batchnorm._NormBase) and \
        m.momentum is not None


class _Refs:
    """The fp32 and float64 reference models, carrying state (BatchNorm running statistics) across calls like the
    judged models, with the same weight changes applied. `how` says what the float64 side is: FLOAT64, PROMOTED
    (kp.float64.Promote), or 'fp32 only: <why>' when no float64 reference could be run."""

    def __init__(self, ref: Reference, init, seed: int, device: str, f64_device: str, train: bool = True):
        self.r32 = ref.model(init, seed, device, train)
        self.r64 = float64_copy(self.r32, f64_device)
        self.f64_device = f64_device
        self.how = FLOAT64
        self.k = 1.0  # the reduction length of the latest call (its budget's floor)
        self.initial = {k: b.detach().clone() for k, b in self.r32.named_buffers()}  # what the calls change

    def state(self) -> dict:
        return self.r32.state_dict()

    def keys(self) -> list[tuple[str, tuple]]:
        return [(k, tuple(v.shape)) for k, v in self.r32.state_dict().items()]

    def update(self, update: dict) -> None:
        apply_update(self.r32, update)
        with torch.no_grad():
            for (_, p32), (_, p64) in zip(self.r32.named_parameters(), self.r64.named_parameters()):
                p64.copy_(p32)

    def save_buffers(self) -> dict:
        return {k: b.clone() for m in (self.r32, self.r64) for k, b in
                ((f"{id(m)}:{n}", b) for n, b in m.named_buffers())}

    def restore_buffers(self, saved: dict | None) -> None:
        with torch.no_grad():
            for m in (self.r32, self.r64):
                for n, b in m.named_buffers():
                    if saved and f"{id(m)}:{n}" in saved:
                        b.copy_(saved[f"{id(m)}:{n}"])

    def fp32_only(self) -> bool:
        return self.how.startswith("fp32 only")

    def _float64(self, pristine: list):
        """The float64 reference's output, or None once none can be made (first FLOAT64, then PROMOTED). Buffers
        a failed try changed are put back, so the stateful sequence stays in step."""
        x64 = as_float64(pristine, self.f64_device)
        while not self.fp32_only():
            saved = {k: b.clone() for k, b in self.r64.named_buffers()}
            try:
                with torch.no_grad(), float64_default(), (Promote() if self.how == PROMOTED else
                                                          contextlib.nullcontext()):
                    return self.r64(*x64)
            except Exception as e:
                with torch.no_grad():
                    for k, b in self.r64.named_buffers():
                        b.copy_(saved[k])
                self.how = PROMOTED if self.how == FLOAT64 else \
                    f"fp32 only: the float64 copy raised {type(e).__name__}: {first_line(e)[:160]}"
        return None

    def expected(self, pristine: list, precision: str) -> Expected:
        from torch.utils.flop_counter import FlopCounterMode
        set_precision(precision)
        try:
            counter, reductions = FlopCounterMode(display=False), ReductionLength()
            with torch.no_grad(), counter, reductions:
                r32 = self.r32(*[clone_layout(x) for x in pristine])
            r64 = self._float64(pristine)
        finally:
            set_precision("fp32")
        numel = lambda ts: sum(t.numel() for t in ts if isinstance(t, torch.Tensor) and t.is_floating_point())
        self.k = max(reductions.k, reduction_length(counter.get_total_flops(),
                                                    max((numel([x]) for x in pristine), default=0),
                                                    numel(_as_list(r32))))
        if r64 is None:
            return Expected.of(r32, r32, fp32_only=True)
        if self.f64_device == "cpu" and torch.cuda.is_available():  # pinned: each chunk of the comparison crosses
            r64 = tuple(t.pin_memory() if isinstance(t, torch.Tensor) else t for t in _as_list(r64)) \
                if isinstance(r64, (tuple, list)) else r64.pin_memory()  # PCIe at full speed
        return Expected.of(r32, r64, k=self.k)


@dataclasses.dataclass
class Expected:
    """What a call must return: per output element the float64 reference and the budget from PyTorch's own fp32
    error on the same inputs (or, for a non-tensor element, the value itself)."""
    is_tuple: bool
    specs: list  # per element: (shape, dtype, device) of PyTorch's fp32 output, or the non-tensor value
    r64: list
    errs: list  # per element: (PyTorch's own Err, budget Err), None for a non-tensor element

    @classmethod
    def of(cls, r32, r64, fp32_only: bool = False, k: float = 1.0) -> "Expected":
        """fp32_only: r64 is PyTorch's fp32 output itself (no float64 reference could be made); the budget is then
        kp.float64.FP32_ONLY_BUDGET. k: the reduction length behind each output element (the budget's floor)."""
        r32l, r64l = _as_list(r32), _as_list(r64)
        specs, errs = [], []
        for a, b in zip(r32l, r64l):
            if isinstance(a, torch.Tensor) and fp32_only:
                specs.append((tuple(a.shape), a.dtype, a.device))
                errs.append((Err(0.0, 0.0, 0), Err(FP32_ONLY_BUDGET, FP32_ONLY_BUDGET, 0)))
            elif isinstance(a, torch.Tensor):
                e = rel_error(a, b)
                specs.append((tuple(a.shape), a.dtype, a.device))
                errs.append((e, budget_from(e, k)))
            else:
                specs.append(a)
                errs.append(None)
        return cls(isinstance(r32, (tuple, list)), specs, r64l, errs)

    def finite(self) -> bool:
        return all(bool(torch.isfinite(t).all()) for t in self.r64 if isinstance(t, torch.Tensor)
                   and t.is_floating_point())

    def torch_unfair(self) -> str | None:
        """Why PyTorch's own fp32 result fails this call's check (then a derived input is not held against a
        candidate), or None."""
        for e in self.errs:
            if e is None:
                continue
            if e[0].nonfinite_mismatch:
                return f"PyTorch fp32 itself gets {e[0].nonfinite_mismatch} NaN/Inf positions wrong (it overflows)"
            if e[0].rel_l2 > TORCH_FAIR_MAX:
                return f"PyTorch fp32 itself is off by relL2 {e[0].rel_l2:.1e}"
        return None


def judge_output(label: str, out, out_type: str, exp: Expected) -> dict:
    """Every element of the output against the float64 reference, within its budget; raises Rejected."""
    n = len(exp.specs)
    if exp.is_tuple != isinstance(out, tuple) or (exp.is_tuple and len(out) != n):
        want = f"a tuple of {n}" if exp.is_tuple else "one torch.Tensor"
        raise Rejected(f"{label}: output is {out_type}, expected {want}")
    outs = list(out) if exp.is_tuple else [out]
    worst = {"rel_l2": 0.0, "worst_row": 0.0, "torch_rel_l2": 0.0, "budget": 0.0}
    for i, (o, spec, b, errs) in enumerate(zip(outs, exp.specs, exp.r64, exp.errs)):
        where = label if not exp.is_tuple else f"{label}: output[{i}]"
        if errs is None:
            if o != spec:
                raise Rejected(f"{where}: {o!r}, the reference gives {spec!r}")
            continue
        shape, dtype, device = spec
        if type(o) is not torch.Tensor or tuple(o.shape) != shape or o.dtype != dtype or o.device != device:
            raise Rejected(f"{where}: output is {o if isinstance(o, str) else describe(o)}, expected "
                           f"torch.Tensor {shape} {dtype} {device}")
        e = rel_error(o, b)
        e_ref, budget = errs
        if not e.within(budget):
            raise Rejected(budget_reason(where, e, budget))
        worst = {"rel_l2": max(worst["rel_l2"], e.rel_l2), "worst_row": max(worst["worst_row"], e.worst_row),
                 "torch_rel_l2": max(worst["torch_rel_l2"], e_ref.rel_l2),
                 "budget": max(worst["budget"], budget.rel_l2)}
    return worst


def reduce_samples(timing: dict, wall_ms: float) -> dict:
    """A worker's timing reply, reduced in the judge's process: median and quartiles from each entry's samples (the
    worker's own summary is not used), host_us as reported. Raises Rejected when the samples add up to more than
    `wall_ms`, the time the whole command took as seen from here: each sample is GPU time between two events inside
    it, one timed call after another."""
    from kp.timing import summarize
    total = sum(sum(v.get("samples") or []) for v in timing.values())
    if total > wall_ms:
        raise Rejected(f"timing: the reported samples add up to {total:.1f} ms, more than the {wall_ms:.1f} ms the "
                       f"timing command took: they were not measured")
    out = {}
    for k, v in timing.items():
        if not v.get("samples"):
            raise Rejected(f"timing: no samples reported for {k}")
        t = dataclasses.asdict(summarize([float(x) for x in v["samples"]]))
        t["host_us"] = v.get("host_us", float("nan"))
        out[k] = t
    return out


def check_told(timing: dict, told: dict) -> None:
    """Raises Rejected unless each entry's samples in a worker's timing reply are those it told the judge one by one,
    right after each call (kept in the judge's process, out of the models' reach): otherwise they were changed in the
    worker after they were taken, or a call went untold."""
    for k, v in timing.items():
        mine = told.get(k, [])
        if [float(x) for x in v.get("samples") or []] != mine:
            raise Rejected(f"timing: the {len(v.get('samples') or [])} samples of {k} returned at the end differ from "
                           f"the {len(mine)} told to the judge after each call: changed in the worker's process")


def below_floor(median_ms: float, input_bytes: int, bandwidth: float) -> str | None:
    """Why a median is impossible, or None: below INPUT_FLOOR_FRACTION of the time to read the call's fresh inputs
    once at the copy bandwidth measured in the same run (weights may be cached between calls and FLOPs rewritten
    away, but inputs drawn anew for every call must be read)."""
    floor_ms = INPUT_FLOOR_FRACTION * input_bytes / bandwidth * 1e3
    if floor_ms >= FLOOR_MIN_MS and median_ms < floor_ms:
        return (f"timing: median {median_ms * 1e3:.1f} us is below {INPUT_FLOOR_FRACTION:g} x the "
                f"{input_bytes / bandwidth * 1e6:.1f} us it takes to read the inputs once at the copy bandwidth "
                f"measured now ({bandwidth / 1e9:,.0f} GB/s): the reported time is impossible")
    return None


def _allclose(got: list, want: list, tol: float) -> str:
    """'pass', or why KernelBench's torch.allclose check fails (shape, or the largest difference)."""
    if len(got) != len(want):
        return f"fail ({len(got)} outputs, expected {len(want)})"
    for g, w in zip(got, want):
        if not isinstance(w, torch.Tensor):
            continue
        if not isinstance(g, torch.Tensor) or g.shape != w.shape:
            return f"fail (output {describe(g) if not isinstance(g, str) else g}, expected {tuple(w.shape)})"
        g = g.to(w.device)
        if not torch.allclose(g.to(w.dtype) if g.dtype != w.dtype else g, w, atol=tol, rtol=tol):
            d = (g.double() - w.double()).abs().nan_to_num(float("inf")).max()
            return f"fail (max difference {float(d):.2e})"
    return "pass"


def _out_bytes_hint(pristine: list) -> int:
    """NaN-filled headroom the worker keeps in its allocator: twice the largest input plus 64 MiB (a larger
    request just gets fresh memory, which the allocator does not zero either)."""
    sizes = [x.numel() * x.element_size() for x in pristine if isinstance(x, torch.Tensor)]
    return 2 * max(sizes, default=0) + (64 << 20)


def _release():
    """Hand cached GPU memory back: a candidate's worker shares the device and needs room for its own."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def row_specs(ref: Reference, variant_list: list[str],
              precision: str = "fp32") -> list[tuple[str, str, dict, bool]]:
    """(label, variant, ModelNew options, peer) of every row of a built-in problem: each variant as is, plus each
    variant under each of the problem's ROW_OPTIONS (e.g. matmul_sum_max_mean_lse's cache=False) that applies to
    the precision judged."""
    out = [(v, v, {}, False) for v in variant_list]
    for tag, opts in getattr(ref.module, "ROW_OPTIONS", {}).items():
        opts = dict(opts)
        only = opts.pop("variants", None)  # an option that applies to some rungs only (e.g. a cuBLAS mode)
        peer = bool(opts.pop("peer", False))
        if precision not in opts.pop("precisions", (precision,)):
            continue
        out += [(f"{v}[{tag}]", v, dict(opts), peer) for v in variant_list if only is None or v in only]
    return out


def default_variants(problem: str, include_records: bool = False) -> list[str]:
    """The rows of a built-in problem's table: the rungs of its ladder that run on this GPU (and the records with
    include_records: --variant all), plus "auto" where the model picks a rung per call."""
    vs = runnable_variants(problem, include_records)
    return vs + (["auto"] if picks_per_call(problem) else [])


class Judge:
    def __init__(self, ref: Reference, *, seed: int | None = None, trials: int = MIN_TRIALS,
                 precision: str = "fp32", device: str | None = None, bench: bool = True,
                 compile_baseline: bool = True, allow_torch: bool = False, min_reps: int = 10, max_reps: int = 100,
                 budget_s: float = 20.0, sandbox: bool = True, profile: bool = False, ncu: bool = False,
                 mode: str = "train", timeout_s: float | None = JOB_TIMEOUT_S, log=progress):
        """mode: 'train' (KernelBench's contract: a fresh Model trains) or 'eval' (inference: both models in eval
        mode). timeout_s: the limit on a candidate's whole job (None: none), each worker call bounded by it."""
        if mode not in MODES:
            raise UsageError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if precision not in PRECISIONS:
            raise UsageError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        if trials < MIN_TRIALS:
            raise UsageError(f"at least {MIN_TRIALS} trials, got {trials}")
        if device is None:
            if not torch.cuda.is_available():
                raise UsageError("no CUDA device visible: use a GPU machine (or --device cpu for the host-side "
                                 "parity checks of a pure-torch candidate)")
            device = "cuda"
        if device not in ("cuda", "cpu"):
            raise UsageError(f"device must be cuda or cpu, got {device!r}")
        if device == "cuda" and not torch.cuda.is_available():
            raise UsageError("no CUDA device visible")
        self.ref, self.precision, self.device, self.trials = ref, precision, device, trials
        self.bench, self.compile_baseline, self.allow_torch = bench, compile_baseline, allow_torch
        self.reps = (min_reps, max_reps, budget_s) if bench else (3, 3, 5.0)
        self.sandbox, self.box_note = sandbox, None  # box_note: what the record says once a candidate is added
        self.profile, self.ncu = profile, ncu
        self.seed = int.from_bytes(os.urandom(4), "little") if seed is None else seed
        self.log = log
        self.mode, self.train = mode, mode == "train"
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s if timeout_s else None
        self.notes: list[str] = []  # said in the verdict line and the record: what the judge could not do as usual
        self.rows: list[Row] = []
        self.runners: list = []
        self.rng = random.SystemRandom()  # which timed calls are checked: decided here, after each call
        self.check_at: dict[str, int] = {}
        self.timed_checks: dict[str, int] = {}
        self.timed_samples: dict[str, list] = {}  # each timed call's sample, as the worker told it right after it
        self.input_buffers: dict[int, torch.Tensor] = {}
        self.t_start = time.perf_counter()
        self._fp = None
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()

    @property
    def fp(self) -> dict:
        """The reference's footprint (shapes, bytes, FLOPs, live peak), taken on first use: the candidates' workers
        are started when they are added, so their start-up (a box, torch's import) runs while this is measured."""
        if self._fp is None:
            self._fp = self.ref.footprint(self.device)
        return self._fp

    @property
    def f64_device(self) -> str:
        fbytes = self.fp["inputs"] + self.fp["outputs"] + self.fp["weights"]
        return self.device if fbytes <= FLOAT64_ON_DEVICE_MAX else "cpu"

    # -- rows ---------------------------------------------------------------------------------------------------
    def add_candidate(self, path: str | Path) -> Row:
        path = Path(path)
        if not path.is_file():
            raise UsageError(f"candidate file {str(path)!r} does not exist")
        boxed, self.box_note = self._box()
        if boxed:
            self.log(f"candidate {path.name}: in a sandbox ({self.box_note})")
        runner = ProcessRunner(self.ref.spec, self.device, self.precision, self._interim, sandbox=boxed,
                               read_only=candidate_paths(path), train=self.train,
                               deadline=self.deadline, limit_s=self.timeout_s,
                               build_dir=str(candidate_build_dir(path)))
        self.runners.append(runner)
        row = Row("candidate", runner, path=str(path))
        runner.passed = row.checks
        self.rows.append(row)
        return row

    def _box(self) -> tuple[bool, str]:
        """Whether the candidate's worker runs in a sandbox, and what the record says about it."""
        if not self.sandbox:
            return False, "unsandboxed (--no-sandbox)"
        from kp import sandbox
        b, why = sandbox.status()
        if b is None:
            return False, f"unsandboxed: {why}"
        return True, f"bwrap; process limit by {sandbox.process_limit()}"

    def add_variants(self, rows: list[tuple[str, str, dict, bool]]) -> list[Row]:
        if not rows:
            return []
        factories = {label: variant_factory(self.ref.module, v, opts, self.precision) for label, v, opts, _ in rows}
        runner = LocalRunner(self.ref.spec, self.device, self.precision, self._interim, factories, self.train)
        self.runners.append(runner)
        out = [Row(label, runner, peer=peer, opts=opts, variant=v) for label, v, opts, peer in rows]
        self.rows += out
        return out

    def add_reference_row(self) -> Row:
        """The reference's own fp32 Model as a judged row ("eager"): what `--ref FILE` alone checks on the CPU, where
        nothing is timed (every parity stage against the float64 reference, PyTorch's own error in the table)."""
        runner = LocalRunner(self.ref.spec, self.device, self.precision, self._interim,
                             {"eager": lambda *init: self.ref.module.Model(*init)}, self.train)
        self.runners.append(runner)
        row = Row("eager", runner)
        self.rows.append(row)
        return row

    def live(self) -> list[Row]:
        return [r for r in self.rows if r.accepted]

    def _each(self, stage_fn):
        """Run stage_fn(row) for every live row; a Rejected rejects that row only."""
        for row in self.live():
            if not row.accepted:  # rejected by an earlier row's stage (a timed-call check)
                continue
            try:
                stage_fn(row)
            except Rejected as e:
                row.reject(str(e))
                self.log(f"{self.ref.name}: {row.label} rejected: {e}")

    # -- stages -------------------------------------------------------------------------------------------------
    def _build(self, row: Row, refs: _Refs, init, seed: int, stage: str = "construct", state=None,
               load: bool = True) -> None:
        """Construct the row's model after the seed and load the reference's state (its state now, or `state`) as
        far as it maps: whole (by name, or in order where the names differ but the shapes line up), else
        KernelBench's same-seed contract (what has the same name and shape is loaded, the rest keeps the
        candidate's own same-seed initialisation, and only what maps is changed between calls)."""
        reply = row.runner.call(stage, "build", row.label, init, seed)
        keys = [(k, tuple(s)) for k, s in reply["keys"]]
        if self.train and reply.get("eval_modules"):
            kinds = reply["eval_modules"]
            what = "BatchNorm would use running statistics" if any("Norm" in k for k in kinds) else \
                "Dropout would be off"
            raise Rejected(f"{stage}: ModelNew is in eval mode (self.training is False) but the reference trains: "
                           f"{what} ({', '.join(kinds)}); --mode eval judges inference semantics")
        ref_keys = refs.keys()
        names = state_map(ref_keys, keys) if ref_keys else {}
        if names is None:  # in order again without the counters nothing reads (a rewrite need not keep them)
            names = state_map([(k, s) for k, s in ref_keys if not _unread_counter(refs.r32, k)], keys)
        if names is None:
            names = partial_map(ref_keys, keys)
            if row.weights is None:
                params = {k for k, _ in refs.r32.named_parameters()}
                moved = sorted(k for k in names if k in params)
                left = unmapped(ref_keys, keys, names)
                row.weights = ("same-seed init; " + (f"loaded and changed between calls: {len(moved)} of "
                                                     f"{len(params)} parameters by name" if moved else
                                                     "not changed between calls: no parameter maps")
                               + (f" ({left})" if left else ""))
                self.log(f"{self.ref.name}: {row.label} weights: {row.weights}")
        row.names = names
        if names and load:
            state = {names[k]: v for k, v in (refs.state() if state is None else state).items() if k in names}
            row.runner.call(stage, "update", row.label, {"kind": "load_state_dict", "state": state})

    def _candidate_inputs(self, pristine: list) -> list:
        """The candidate's copy of the inputs. Successive calls whose inputs have one layout get one buffer,
        refilled (and the worker keeps the previous call's inputs mapped, so they arrive at the same address): a
        model that keys a cache on data_ptr() meets new values at an address it has seen and is caught at its
        second call, not whenever the allocator happens to hand an address back."""
        out = []
        for i, x in enumerate(pristine):
            if not isinstance(x, torch.Tensor):
                out.append(x)
                continue
            buf = self.input_buffers.get(i)
            if buf is None or (buf.dtype, buf.device, buf.shape, buf.stride(), buf.storage_offset(),
                               buf.untyped_storage().nbytes()) != (x.dtype, x.device, x.shape, x.stride(),
                                                                   x.storage_offset(), x.untyped_storage().nbytes()):
                buf = self.input_buffers[i] = clone_layout(x)
            else:
                buf.copy_(x)
            out.append(buf)
        return out

    def _drop_input_buffers(self) -> None:
        """End of a parity stage: the buffers and the workers' mappings of them go (the timing stage needs room)."""
        self.input_buffers.clear()
        for runner in {id(r.runner): r.runner for r in self.live()}.values():  # a rejected row's may hang
            try:
                runner.call("release", "release_inputs")
            except Rejected:
                pass  # a dead worker holds nothing
        _release()

    def _check_call(self, row: Row, label: str, pristine: list, exp: Expected) -> dict:
        cand_inputs = self._candidate_inputs(pristine)
        reply = row.runner.call(label, "forward", row.label, cand_inputs, _out_bytes_hint(pristine))
        if self.precision == "fp32" and reply["tf32_after"]:
            raise Rejected(f"{label}: the model switched TF32 on in fp32 mode")
        for i, (a, b) in enumerate(zip(cand_inputs, pristine)):
            if isinstance(b, torch.Tensor) and not same_values(a, b):
                raise Rejected(f"{label}: input {i} was modified")
        res = judge_output(label, reply["out"], reply["type"], exp)
        del reply, cand_inputs
        _release()
        return res

    def _check_buffers(self, row: Row, label: str, refs: _Refs) -> None:
        """The state the reference's calls change (BatchNorm running statistics in training mode) must be kept and
        match. A buffer the calls leave as built is the reference's constant, not state: a candidate may fold it
        away. BatchNorm's num_batches_tracked is read only when its momentum is None (a cumulative average)."""
        b32 = {k: v for k, v in refs.r32.named_buffers()
               if k not in refs.initial or not _same_buffer(v, refs.initial[k])}
        if not b32:
            return
        cand = row.runner.call(label, "buffers", row.label)["buffers"]
        b64 = dict(refs.r64.named_buffers())
        for k, v in b32.items():
            ck = (row.names or {}).get(k, k)
            if ck not in cand:
                if _unread_counter(refs.r32, k):
                    continue
                mode = "training" if refs.r32.training else "eval"
                raise Rejected(f"{label}: the model has no buffer {k!r}, which the reference carries between its "
                               f"{mode}-mode calls as state, so the candidate's state cannot be checked")
            c = cand[ck]
            if not v.is_floating_point():
                if not torch.equal(c.cpu(), v.cpu()):
                    raise Rejected(f"{label}: buffer {k} is {c.tolist()}, the reference's {v.tolist()}")
                continue
            if c.shape != v.shape:
                raise Rejected(f"{label}: buffer {k} has shape {tuple(c.shape)}, the reference's {tuple(v.shape)}")
            e_ref, e = rel_error(v, b64[k]), rel_error(c.to(v.device), b64[k])
            budget = budget_from(e_ref, refs.k)
            if not e.within(budget):
                raise Rejected(f"{label}: buffer {k} differs from the reference's (relL2 {e.rel_l2:.2e}, budget "
                               f"{budget.rel_l2:.2e})")

    def _sequence(self) -> list[tuple[str, int, str | None, str | None]]:
        """(label, input seed, weight change before the call, derived-input transform) of the stateful parity
        calls on benchmark-shape inputs."""
        seeds = trial_seeds(self.seed, self.trials + len(DERIVED))
        calls = []
        for i in range(self.trials):
            upd = UPDATES[(i - 1) % len(UPDATES)] if i else None
            calls.append((f"trial {i + 1} (seed {seeds[i]}{', after an ' + upd if upd else ''})", seeds[i], upd,
                          None))
        for j, name in enumerate(DERIVED):
            s = seeds[self.trials + j]
            calls.append((f"inputs {name} (seed {s})", s, None, name))
        return calls

    def _parity_bench(self, init) -> None:
        refs = self.refs = _Refs(self.ref, init, self.seed, self.device, self.f64_device, self.train)
        self._each(lambda row: self._build(row, refs, init, self.seed))
        premises = Premises()  # what every trial's draw shares: the derived inputs keep it or are skipped
        base_finite = None
        passed_before = {}
        for label, s, upd, derive in self._sequence():
            if not self.live():
                break
            changed = upd and self._each_update(refs, upd, s)
            if upd and not changed:  # nothing to change: the call is a plain one and says so
                label = label.replace(f", after an {upd}", "")
            pristine = self.ref.inputs(s, self.device)
            if not derive:
                premises.see(pristine)
            elif not any(isinstance(x, torch.Tensor) and x.is_floating_point() for x in pristine):
                self._skip(f"{label}: no floating-point input to derive from")
                continue
            elif premises.broken(derive):
                self._skip(f"{label}: {premises.broken(derive)}")
                continue
            else:
                pristine = [DERIVED[derive](x) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                            for x in pristine]
            saved = refs.save_buffers() if derive else None  # a skipped call leaves the reference's state as it was
            try:
                exp = refs.expected(pristine, self.precision)
            except Exception as e:
                if not derive:
                    raise UsageError(f"the reference itself raised on its own inputs ({label}): "
                                     f"{type(e).__name__}: {first_line(e)}") from None
                refs.restore_buffers(saved)
                self._skip(f"{label}: the reference raises there ({type(e).__name__}: {first_line(e)[:100]})")
                continue
            finite = exp.finite()
            if base_finite is None:
                base_finite = finite
            why = None
            if derive and base_finite and not finite:
                why = "the float64 reference is not finite there"
            elif derive:
                why = exp.torch_unfair()
            if why:
                refs.restore_buffers(saved)
                self._skip(f"{label}: {why}")
                continue

            def one(row):
                try:
                    row.checks[label] = self._check_call(row, label, pristine, exp)
                except Rejected as e:
                    if changed and passed_before.get(row.label):
                        raise Rejected(f"{e}; it passed before the weights changed ({upd}): a value derived from "
                                       f"the weights is not recomputed (stale weight cache)") from None
                    if not passed_before.get(row.label) and not upd and not derive and row.names and \
                            ("relL2" in str(e) or "NaN/Inf" in str(e)):
                        hint = self._own_init(row, init, label, pristine, exp)
                        if hint:
                            raise Rejected(f"{e}; {hint}") from None
                    raise
                passed_before[row.label] = True
                self._check_buffers(row, f"buffers after {label}", refs)

            self._each(one)
            del pristine, exp
            _release()
        premises.forget()
        if refs.fp32_only():
            self.notes.append(f"no float64 reference ({refs.how}); judged against PyTorch's fp32 output with "
                              f"relL2 budget {FP32_ONLY_BUDGET:g}")

    def _skip(self, what: str) -> None:
        self.skipped.append(what)
        self.log(f"{self.ref.name}: skipped {what}")

    def _own_init(self, row: Row, init, label: str, pristine: list, exp: Expected) -> str | None:
        """A row wrong with the reference's weights loaded, judged once more at its own same-seed initialisation
        (nothing loaded): when that passes, why it failed is that its parameters mean something else."""
        try:
            row.runner.call(label, "build", row.label, init, self.seed)
            self._check_call(row, label, pristine, exp)
        except Rejected:
            return None
        how = "by name" if all(k == v for k, v in row.names.items()) else "in order"
        return (f"right at its own same-seed initialisation, wrong with the reference's weights loaded {how}: its "
                f"parameters mean something else (e.g. pre-scaled, transposed or folded)")

    def _each_update(self, refs: _Refs, kind: str, seed: int) -> bool:
        """Change the weights alike on every side; False when the model has none to change."""
        live = [r for r in self.live() if r.names is not None]
        only = set.intersection(*[set(r.names) for r in live]) if live else None
        upd = make_update(kind, refs.r32, seed, only)
        if not upd:
            return False
        refs.update(upd)
        self._each(lambda row: row.runner.call(f"weights ({kind})", "update", row.label,
                                               rename_update(upd, row.names)))
        return True

    def _parity_cases(self) -> None:
        seeds = [self.seed] if self.device == "cuda" else trial_seeds(self.seed, MIN_TRIALS)
        for name in self.ref.cases:
            for s in seeds:
                if not self.live():
                    return
                c_init, c_inputs = self.ref.case(name, s, self.device)
                c_refs = _Refs(self.ref, c_init, s, self.device, self.device, self.train)
                label = f"case {name} (seed {s})"
                state0 = {k: v.clone() for k, v in c_refs.state().items()}  # before the reference's call
                exp = c_refs.expected(c_inputs, self.precision)

                def one(row):
                    self._build(row, c_refs, c_init, s, stage=label, state=state0)
                    row.checks[label] = self._check_call(row, label, c_inputs, exp)
                    self._check_buffers(row, f"buffers after {label}", c_refs)
                    row.runner.call(label, "drop", row.label)

                self._each(one)
                del c_refs, c_inputs, exp

    def _kernelbench(self, init, runs: bool = True) -> None:
        """KernelBench's own correctness check on each candidate, beside ours (it never decides the verdict):
        Model and ModelNew built after the same seed, nothing loaded or changed, KERNELBENCH_TRIALS draws of
        get_inputs(), torch.allclose at each of KERNELBENCH_TOLS (atol = rtol) on every output. Training mode, as
        KernelBench builds its models. runs=False: the benchmark shape is not run here (over the CPU limit), and the
        check is said not to have run."""
        for row in self.rows:
            if not row.runner.isolated:
                continue
            if not runs:
                row.kernelbench = {t: "not run (the benchmark shape is over the CPU limit)" for t in KERNELBENCH_TOLS}
                continue
            out = {}
            try:
                seed = (self.seed + 4000) % 2**32
                model = self.ref.model(init, seed, self.device)
                row.runner.call("kernelbench check", "build", "kernelbench", init, seed, "candidate", True)
                for s in trial_seeds(seed, KERNELBENCH_TRIALS):
                    x = self.ref.inputs(s, self.device)
                    with torch.no_grad():
                        want = _as_list(model(*[clone_layout(t) for t in x]))
                    got = row.runner.call("kernelbench check", "forward", "kernelbench", x, 0)["out"]
                    got = list(got) if isinstance(got, tuple) else [got]
                    for tol in KERNELBENCH_TOLS:
                        if out.get(tol, "pass") == "pass":
                            out[tol] = _allclose(got, want, float(tol))
                    del x, want, got
                row.runner.call("kernelbench check", "drop", "kernelbench")
                row.runner.call("kernelbench check", "release_inputs")
            except Rejected as e:
                out = {t: f"not run ({e})" for t in KERNELBENCH_TOLS if out.get(t, "pass") == "pass"} \
                    | {k: v for k, v in out.items() if v != "pass"}
                if "timeout after" in str(e):  # the job's time ran out here: that is the verdict
                    row.reject(str(e))
            row.kernelbench = {k: out[k] for k in sorted(out, key=float)}
            _release()

    def _interim(self, msg: dict):
        """A timed call, reported by a worker outside the timed region, before any other code of the models has run.
        First its sample (`ms`, kept here: the median is taken from these) and, for a judged row (`ask`), its seed:
        the answer, decided here, is whether the judge checks it (each row's call at a secret rep below the least
        number of reps, and others at random). Then a checked call's output and inputs: checked here against the
        reference for that seed, computed now."""
        if "ms" in msg:
            self.timed_samples.setdefault(msg["label"], []).append(float(msg["ms"]))
        row = next((r for r in self.rows if r.label == msg["label"] and r.accepted), None)
        if row is None or ("ms" in msg and not msg.get("ask")):
            return False
        if msg.get("ask"):
            n = self.timed_checks.setdefault(row.label, 0)
            want = msg["rep"] == self.check_at.setdefault(row.label, self.rng.randrange(self.reps[0])) or \
                (n < MAX_TIMED_CHECKS and self.rng.random() < EXTRA_CHECK_P)
            self.timed_checks[row.label] = n + want
            return want
        seed = msg["seed"]
        label = f"timed call (rep {msg['rep']}, inputs seed {seed})"
        try:
            pristine = self.ref.inputs(seed, self.device)
            for i, (a, b) in enumerate(zip(msg["inputs"], pristine)):
                if isinstance(b, torch.Tensor) and not same_values(a, b):
                    raise Rejected(f"{label}: input {i} was modified (or is not the draw of the seed it reported)")
            exp = self.refs.expected(pristine, self.precision)
            row.checks[label] = judge_output(label, msg["out"], msg["type"], exp)
        except Rejected as e:
            row.reject(str(e))
        del msg
        _release()
        return True

    def _rebuild(self, init) -> None:
        """The declared cases built models of their own shapes: back to the benchmark's, with the current weights."""
        self._each(lambda row: self._build(row, self.refs, init, self.seed, stage="escape"))

    def _timing(self) -> dict:
        """Every runner's rows and baselines timed side by side (Worker.cmd_time). Its samples are reduced here, and
        must fit in the wall time this process saw the command take: samples that add up to more were not measured
        (a forged reply, or samples rewritten in the worker)."""
        refs = self.refs
        self._each_update(refs, "in-place edit", (self.seed + 999) % 2**32)
        self.check_at, self.timed_checks = {}, {}
        _release()
        result = {}
        timed = [(runner, [r for r in self.live() if r.runner is runner]) for runner in self.runners]
        timed = [(runner, rows) for runner, rows in timed if rows or not self.rows]  # no rows: baselines alone
        for runner, rows in timed:
            t0 = time.perf_counter()
            self.timed_samples = {}
            try:
                t = runner.call("timing", "time", [r.label for r in rows], 2, *self.reps)
                check_told(t["timing"], self.timed_samples)
                times = reduce_samples(t["timing"], (time.perf_counter() - t0) * 1e3)
            except Rejected as e:
                for r in rows:
                    r.reject(str(e))
                continue
            result.setdefault("timing", {}).update(times)
            result.setdefault("rungs", {}).update(t["rungs"])
            result.setdefault("calls", {}).update(t["calls"])
            for r in rows:
                if r.accepted and not self.timed_checks.get(r.label):
                    r.reject("timing: no timed call of this row was offered for a check")
        return result

    def _profile(self) -> dict:
        """One call of each baseline and live row under the profiler, in the process that holds it (a candidate's
        own worker); a failure here is logged, never a verdict."""
        out = {}
        for runner in self.runners:
            rows = [r for r in self.live() if r.runner is runner]
            if self.rows and not rows:
                continue
            try:
                out.update(runner.call("profile", "profile", [r.label for r in rows],
                                       (self.seed + 3000) % 2**32)["profile"])
            except Rejected as e:
                self.log(f"{self.ref.name}: no profile: {e}")
        return out

    def _ncu(self, init, rec: dict) -> dict:
        """One call of each baseline and live row under Nsight Compute (kp.ncu), in a process of its own started
        after the judge's rows are released; a boxed candidate is left out (kp.ncu says why)."""
        from kp import ncu
        from kp.report import row_traffic
        rows, notes = [], []
        for r in self.live():
            if r.runner.isolated:
                if r.runner.sandboxed:
                    notes.append(f"{r.label} not profiled: it runs in the sandbox, which ncu cannot reach into "
                                 f"(--no-sandbox includes it)")
                    continue
                rows.append({"label": r.label, "candidate": str(Path(r.path).resolve())})
            else:
                rows.append({"label": r.label, "variant": r.variant, "opts": r.opts})
        min_bytes = {k: row_traffic(rec, k)["bytes"] for k in ["eager", "torch.compile"] + [r["label"] for r in rows]
                     } if rec.get("traffic") else {}
        spec = {"ref_spec": list(self.ref.spec), "precision": self.precision, "init": init, "seed": self.seed,
                "compile": self.compile_baseline, "rows": rows, "notes": notes}
        self.log(f"{self.ref.name}: one call of each row under Nsight Compute")
        _release()
        return ncu.run(spec, min_bytes, rec.get("bandwidth"))

    def _escape_try(self, row: Row, seed: int) -> tuple:
        """One escape measurement: (reply, median event ms, host-clock excess ms, activities outside the window,
        the window)."""
        e = row.runner.call("escape", "escape", row.label, seed % 2**32)
        ev_ms = sorted(s[1] for s in e["samples"])[len(e["samples"]) // 2]
        control = max(host_clock_excess_ms(e["control"]), 0.0)  # what the same steps cost around no call, now
        return (e, ev_ms, host_clock_excess_ms(e["samples"]) - control, *window_violations(e["events"], e["marker"]))

    def _escape(self, row: Row) -> dict:
        e, ev_ms, excess, bad, window = self._escape_try(row, self.seed + 2000)
        for attempt in range(ESCAPE_RETRIES):  # only the host clock objects: work that escapes the events does so
            if bad or excess <= escape_threshold_ms(ev_ms):  # on every try, while another process's kernels on a
                break  #                                       shared GPU lengthen one try and not the next
            again = self._escape_try(row, self.seed + 2001 + attempt)
            if again[3] or again[2] < excess:
                e, ev_ms, excess, bad, window = again
        info = {"host_excess_ms": excess, "threshold_ms": escape_threshold_ms(ev_ms), "event_ms": ev_ms,
                "streams": sorted({str(x["stream"]) for x in e["events"] if x["name"] != e["marker"]}),
                "outside_window": [(x["name"][:80], x["stream"]) for x in bad]}
        row.escape = info
        if window is None:
            raise Rejected("escape: the profiler saw no marker kernels (is the profiler working here?)")
        if bad:
            x = bad[0]
            where = "after" if x["ts"] + x["dur"] > window[1] else "before"
            raise Rejected(f"escape: GPU work outside the timed window ({len(bad)} activities, e.g. "
                           f"{kernel_base_name(x['name'])[:60]} on stream {x['stream']} ending {where} the window): "
                           f"work escaped the timed stream")
        if excess > escape_threshold_ms(ev_ms):
            raise Rejected(f"escape: the host clock saw {excess:.3f} ms more than the CUDA events per call "
                           f"(events {ev_ms:.3f} ms), beyond what it sees around no call: work escaped the timed "
                           f"stream")
        row.own_kernels = e["own"]
        row.kernels = sorted({x["name"][:120] for x in e["events"] if x["name"] != e["marker"]})
        if not e["own"]:
            if self.allow_torch or row.peer:
                row.pure_torch = not row.peer
            else:
                raise Rejected(f"own kernel: no kernel from the row's own build ran (kernels seen: "
                               f"{', '.join(kernel_base_name(k) for k in row.kernels[:4]) or 'none'}); "
                               f"--allow-torch judges a pure-PyTorch rewrite")
        return info

    def ceilings(self, traffic: dict) -> dict:
        """The ceilings measured now: device copy bandwidth for bytes, and the GEMM rates of the chosen precision
        for FLOPs when the reference does any; the bound from arithmetic intensity unless the file declares it."""
        _release()
        free = free_gpu_bytes()
        copy_bytes = max(min(4 << 30, int(0.4 * free)) >> 28 << 28, 256 << 20)  # far above L2 either way
        gemm_n = 8192 if 38 * 8192 ** 2 < 0.5 * free else 4096  # 38 n^2 bytes: fp32, fp16, fp64 operands + results
        if copy_bytes < 4 << 30 or gemm_n < 8192:
            self.log(f"{self.ref.name}: ceilings measured on a {copy_bytes >> 20} MiB copy and {gemm_n}^3 GEMMs: "
                     f"{free / 2**30:.1f} GiB of GPU memory free (the GPU is shared)")
        bw = copy_bandwidth(copy_bytes)
        out = {"bandwidth": bw, "flops_rate": None, "rates": {}}
        if traffic.get("flops"):
            out["rates"] = gemm_rates(n=gemm_n, precision=self.precision)
            out["flops_rate"] = max(out["rates"].values())
        bound = self.ref.bound
        if bound is None:
            t_bytes = traffic["bytes"] / bw
            t_flops = traffic["flops"] / out["flops_rate"] if out["flops_rate"] else 0.0
            bound = "compute" if t_flops > t_bytes else "memory"
        out["bound"] = bound
        return out

    # -- the whole run ------------------------------------------------------------------------------------------
    def run_cases(self) -> list[Row]:
        """The declared cases alone (small shapes, e.g. under compute-sanitizer); returns the rows."""
        self.skipped = []
        try:
            self._parity_cases()
        finally:
            for runner in self.runners:
                runner.close()
        return self.rows

    def run(self) -> dict:
        gpu = self.device == "cuda"
        seeds = [s for _, s, _, _ in self._sequence()]
        self.log(f"{self.ref.name}: seed {self.seed} (calls {', '.join(map(str, seeds))}; replay with --seed "
                 f"{self.seed})")
        self.skipped = []
        rec = {"reference": self.ref.name, "ref_spec": list(self.ref.spec), "seed": self.seed, "mode": self.mode,
               "notes_list": self.notes, "timeout_s": self.timeout_s,
               "trial_seeds": seeds[:self.trials], "precision": self.precision, "device":
               torch.cuda.get_device_name() if gpu else "cpu", "torch": torch.__version__, "footprint": self.fp,
               "shape": self.fp["shapes"],
               "rows": {}, "skipped": self.skipped}
        if self.box_note:
            rec["sandbox"] = self.box_note
        init = self.ref.init()
        stages, last = {}, [time.perf_counter()]

        def mark(stage: str) -> None:  # seconds spent since the previous mark, into `stage`
            now = time.perf_counter()
            stages[stage] = stages.get(stage, 0.0) + now - last[0]
            last[0] = now
        try:
            if gpu:
                check_memory(self.ref.name, self.fp, len(self.rows), torch.cuda.mem_get_info()[0])
            refs0 = self.ref.model(init, self.seed, self.device, self.train)
            state = refs0.state_dict()
            if gpu and self.bench:
                self.log(f"{self.ref.name}: building the eager{' and torch.compile' if self.compile_baseline else ''}"
                         f" baselines")
                for runner in self.runners:
                    runner.call("baselines", "baselines", init, self.seed, state, self.compile_baseline,
                                self.seed)
            del refs0, state
            mark("setup and baselines")
            for row in self.rows:
                if row.runner.isolated:
                    try:
                        if not row.runner.call("import", "load", str(Path(row.path).resolve()))["has_model_new"]:
                            row.reject("import: the file defines no class ModelNew")
                    except Rejected as e:
                        row.reject(str(e))
            mark("import")
            t0 = time.perf_counter()
            why_not = None if gpu else cpu_bench_refusal(self.fp, host_available())
            bench_parity = why_not is None
            if bench_parity:
                self._parity_bench(init)
                self._drop_input_buffers()
            else:
                rec["notes"] = f"{why_not}; declared cases only"
            self._parity_cases()
            self._drop_input_buffers()
            mark("parity")
            self._kernelbench(init, runs=bench_parity)
            mark("kernelbench check")
            self.log(f"{self.ref.name}: parity done in {time.perf_counter() - t0:.0f} s "
                     f"({sum(r.accepted for r in self.rows)}/{len(self.rows)} rows pass)")
            if gpu:
                t0 = time.perf_counter()
                self._rebuild(init)
                with gpu_to_itself(self.log):  # escape, timing and the ceilings: with no other judge's kernels
                    self._each(self._escape)  # first: work that escapes the timer would also race the timing loop
                    mark("escape")
                    timed = self._timing()
                    mark("timing")
                    self.log(f"{self.ref.name}: escape checks and timing done in {time.perf_counter() - t0:.0f} s")
                    rec.update(timed)
                    x = self.ref.inputs(self.seed, self.device)
                    rec["traffic"] = {r.label: self.ref.traffic(x, init, self.fp, r.opts) for r in self.rows}
                    rec["traffic"]["eager"] = rec["traffic"]["torch.compile"] = self.ref.traffic(x, init, self.fp)
                    del x
                    _release()
                    peaks = [torch.cuda.max_memory_reserved()]  # before the ceilings' own probe buffers
                    for runner in self.runners:
                        if runner.isolated:
                            try:
                                peaks.append(runner.call("memory", "memory")["peak"])
                            except Rejected:
                                pass
                    rec["peak_gpu_bytes"] = sum(peaks)
                    rec["memory_need"] = memory_need(self.fp, len(self.rows))
                    if self.bench and rec.get("timing"):
                        rec.update(self.ceilings(rec["traffic"]["eager"]))
                        for row in self.live():  # a time the hardware cannot give: not measured
                            if row.runner.isolated and row.label in rec["timing"]:
                                why = below_floor(rec["timing"][row.label]["median_ms"], self.fp["inputs"],
                                                  rec["bandwidth"])
                                if why:
                                    row.reject(why)
                    mark("traffic, memory and ceilings")
            if self.profile:
                rec["profile"] = self._profile()
                mark("profile")
        except torch.OutOfMemoryError as e:  # the plan checked the free memory at the start; it can shrink since
            free = torch.cuda.mem_get_info()[0] / 2**30
            raise UsageError(f"{self.ref.name}: the GPU ran out of memory in the judge's own process after "
                             f"{', '.join(stages) or 'the start'} ({free:.1f} GiB free now; the plan needs "
                             f"{memory_need(self.fp, len(self.rows)) / 2**30:.1f} GiB): another process took GPU "
                             f"memory during the run ({first_line(e)[:120]})") from None
        finally:
            for runner in self.runners:
                runner.close()
        if self.ncu and gpu:
            rec["ncu"] = self._ncu(init, rec)
            mark("ncu")
        rec["stage_seconds"] = {k: round(v, 2) for k, v in stages.items()}
        rec["elapsed_s"] = round(time.perf_counter() - self.t_start, 2)  # from the judge's start: footprint included
        for row in self.rows:
            rec["rows"][row.label] = {
                "accepted": row.accepted, "reason": row.reason, "peer": row.peer, "checks": row.checks,
                "pure_torch": row.pure_torch, "own_kernels": row.own_kernels,
                "kernels": row.kernels, "escape": row.escape, "path": row.path, "opts": row.opts,
                "weights": row.weights, "kernelbench": row.kernelbench,
                "build_failures": getattr(row.runner, "build_failures", [])}
        if getattr(self, "refs", None) is not None:
            rec["reference_precision"] = self.refs.how
        rec["ok"] = all(r.accepted or r.peer for r in self.rows)
        rec["stages_not_run"] = ([] if gpu else ["timing", "escape", "own kernel"])
        return rec


def evaluate(ref: Reference | str, candidate: str | Path | None = None, variants: list[str] | None = None,
             **kw) -> dict:
    """Judge a candidate file and/or the playground's variants against a reference (a Reference, or a built-in
    problem id). Returns the record; rec['rows'][label]['accepted'] and ['reason'] carry the verdicts."""
    if isinstance(ref, str):
        ref = Reference.load(("problem", ref))
    j = Judge(ref, **kw)
    if variants:
        if ref.problem is None:
            raise UsageError("variants belong to built-in problems; --ref files are judged with --candidate")
        j.add_variants(row_specs(ref, variants, j.precision))
    if candidate is not None:
        j.add_candidate(candidate)
    if not j.rows and (j.device == "cpu" or not j.bench):  # the reference alone, nothing timed: its own Model's
        #                                                    parity against float64
        j.add_reference_row()
    elif not j.rows:  # the reference alone: eager vs torch.compile vs the ceilings
        j.runners.append(LocalRunner(ref.spec, j.device, j.precision, j._interim, {}, j.train))
    return j.run()


