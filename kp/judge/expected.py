"""What one judged call must return and how it is judged: the row being judged, the fp32 and float64 references
it is compared with, the expected output and its budget, and the verdict on an output."""
from __future__ import annotations

import contextlib
import dataclasses

import torch

from kp.errors import Rejected, first_line
from kp.judge.float64 import Promote, as_float64, float64_copy, float64_default, fp32_only_budget, hold_on
from kp.lib.layers import set_precision
from kp.lib.numerics import (HALF_DTYPES, Err, ReductionLength, batch_rows, budget_from, budget_reason, clone_layout,
                             dtype_floor, dtype_name, reduction_length, rel_error, unit_roundoff)
from kp.judge.reference import Reference, _as_list, apply_update, describe

# A derived input counts only where PyTorch's own fp32 result is a fair answer there: NaN/Inf where the float64
# reference has them, and a relL2 under this (~8,000 fp32 ulps: beyond it fp32 itself cannot compute the problem at
# those values, e.g. a product of 256 numbers near -3, and no fp32 kernel can be asked to).
TORCH_FAIR_MAX = 1e-3  # (in fp16 and bf16: torch_fair_max)
FLOAT64, PROMOTED = "float64", "float64, every torch op's floating arguments promoted"


def torch_fair_max(dtype: torch.dtype) -> float:
    """PyTorch's own error above which a derived input is not held against a candidate: TORCH_FAIR_MAX in fp32
    (about 10^4 ulps); in fp16 and bf16 sixteen roundings' worth, 16 u (bf16 6.3e-2, fp16 7.8e-3), since one
    rounding of the output alone is about u / sqrt(3) there."""
    return 16 * unit_roundoff(dtype) if dtype in HALF_DTYPES else TORCH_FAIR_MAX


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
    reference: bool = False  # the reference's own Model (`--ref` alone): PyTorch by definition, no own kernel asked
    path: str | None = None  # the candidate file
    own_kernels: dict | None = None
    kernels: list | None = None
    escape: dict | None = None
    variant: str | None = None  # the built-in rung a row runs (its label may carry options: "v[cache=False]")
    weights: str | None = None  # how the reference's weights reached the row, when not whole (same-seed contract)
    kernelbench: dict | None = None  # KernelBench's own correctness check on the same candidate: tolerance -> verdict
    respawn: object = None  # a candidate's: starts a fresh worker for it as its first one was started
    traceback: str | None = None  # where the candidate's own code raised, when a rejection is a raise

    def reject(self, reason) -> None:
        """Reject with `reason` (a string, or the Rejected raised: its traceback, if it carries one, is kept)."""
        if self.accepted:
            self.accepted, self.reason = False, str(reason)
            self.traceback = getattr(reason, "traceback", None)


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
    (kp.judge.float64.Promote), or 'fp32 only: <why>' when no float64 reference could be run."""

    def __init__(self, ref: Reference, init, seed: int, device: str, f64_device: str, train: bool = True,
                 chunks: int = 1):
        self.r32 = ref.model(init, seed, device, train)
        self.r64 = float64_copy(self.r32, f64_device)
        self.f64_device = f64_device
        # On the GPU, the float64 forward in this many slices of the batch (rows of dim 0) where its whole peak does
        # not fit (kp.judge.plan.float64_chunks): proved on the first call, where the fp32 reference on a slice
        # must give the same rows as on the whole batch, or it runs on the host.
        self.chunks, self.chunk_proof = chunks, None
        self.moved = None  # why the float64 reference left the GPU during the run, if it did
        self.how = FLOAT64
        self.k = 1.0  # the reduction length of the latest call (its budget's floor)
        self.initial = {k: b.detach().clone() for k, b in self.r32.named_buffers()}  # what the calls change
        # The plain tensor attributes a call replaces or changes (KernelBench's RNN cells keep their hidden state
        # in `self.hidden`): watched over the first two calls and taken from the second, so a value a forward
        # builds once and keeps (a lazily made cache) is not state; [] when there are none. Each call's output then
        # depends on the calls before it, and the judge keeps this reference in step with the candidate through
        # every stage.
        self.state_attrs: list[str] | None = None
        self._state_calls = 0  # calls watched so far (two at most)

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
        """The state a call may change, buffers and plain tensor attributes, of both references."""
        out = {k: b.clone() for m in (self.r32, self.r64) for k, b in
               ((f"{id(m)}:{n}", b) for n, b in m.named_buffers())}
        out["plain"] = [(sub, k, v) for m in (self.r32, self.r64) for sub, k, v in plain_tensors(m)]
        return out

    def restore_buffers(self, saved: dict | None) -> None:
        """Back to the state save_buffers() took: a call whose check is skipped leaves the references as they were
        (the candidate is not called either)."""
        with torch.no_grad():
            for m in (self.r32, self.r64):
                for n, b in m.named_buffers():
                    if saved and f"{id(m)}:{n}" in saved:
                        b.copy_(saved[f"{id(m)}:{n}"])
        for sub, k, v in (saved or {}).get("plain", []):  # an attribute a call re-assigns: the old tensor back
            sub.__dict__[k] = v

    def to_host(self) -> None:
        """The float64 reference to the host from here on, its GPU memory handed back."""
        self.r64, self.f64_device = hold_on(self.r64, "cpu"), "cpu"
        _release()

    def fp32_only(self) -> bool:
        return self.how.startswith("fp32 only")

    def advance(self, pristine: list, precision: str) -> None:
        """One call of both references on `pristine`, nothing compared: a stateful reference brought through a
        call the candidate made unchecked (its state moves as that call moved the candidate's)."""
        set_precision(precision)
        try:
            with torch.no_grad():
                self.r32(*[clone_layout(x) for x in pristine])
            self._float64(pristine)
        finally:
            set_precision("fp32")

    def _other_algorithms(self, pristine: list, counter) -> list:
        """The reference's output under PyTorch's other legal choices of algorithm, for a call that runs a cuDNN
        convolution on the GPU: cuDNN's autotuner on (cudnn.benchmark) and the inputs in channels-last layout, which
        select other algorithms of the judged dtype (fp32, bf16, fp16) with other summation orders. A candidate may
        make either choice, so PyTorch's own error (the budget's base) is the worst of these on the same inputs. The references' state
        (buffers, plain tensor attributes) is put back after each run: these calls are not in the sequence."""
        if not any(isinstance(x, torch.Tensor) and x.is_cuda for x in pristine):
            return []
        ops = {str(op) for counts in counter.get_flop_counts().values() for op in counts}
        if not any("convolution" in op for op in ops):
            return []
        out = []
        for channels_last in (False, True):
            saved = self.save_buffers()
            old = torch.backends.cudnn.benchmark
            torch.backends.cudnn.benchmark = True
            try:
                with torch.no_grad():
                    xs = [_layouts_other(x) if channels_last else clone_layout(x) if isinstance(x, torch.Tensor)
                          else x for x in pristine]
                    y = self.r32(*xs)
                out.append(tuple(t.contiguous() if isinstance(t, torch.Tensor) else t for t in _as_list(y))
                           if isinstance(y, (tuple, list)) else y.contiguous())
            except Exception:
                pass  # an algorithm PyTorch cannot run here is no choice a candidate has
            finally:
                torch.backends.cudnn.benchmark = old
                self.restore_buffers(saved)
        return out

    def _float64(self, pristine: list):
        """The float64 reference's output, or None once none can be made (first FLOAT64, then PROMOTED). Buffers
        a failed try changed are put back, so the stateful sequence stays in step. On the GPU, a forward that runs
        out of memory (the plan's estimate was short) is repeated on the host, which has room, and says so."""
        try:
            return self._float64_try(pristine, self.f64_device)
        except torch.OutOfMemoryError:
            if self.f64_device == "cpu":
                raise
        # here, past the except block, the failed try's GPU tensors are free before the host takes over
        self.to_host()
        self.moved = "moved to the host after the GPU ran out of memory in its forward"
        return self._float64_try(pristine, "cpu")

    def _float64_try(self, pristine: list, device: str):
        while not self.fp32_only():
            saved = {k: b.clone() for k, b in self.r64.named_buffers()}
            try:
                with torch.no_grad(), float64_default(), (Promote() if self.how == PROMOTED else
                                                          contextlib.nullcontext()):
                    if self.chunks > 1:
                        return self._by_rows(pristine, device)
                    return self.r64(*as_float64(pristine, device))
            except Exception as e:
                with torch.no_grad():
                    for k, b in self.r64.named_buffers():
                        b.copy_(saved[k])
                if isinstance(e, torch.OutOfMemoryError):
                    raise
                self.how = PROMOTED if self.how == FLOAT64 else \
                    f"fp32 only: the float64 copy raised {type(e).__name__}: {first_line(e)[:160]}"
        return None

    def _by_rows(self, pristine: list, device: str):
        """The float64 forward slice by slice of the batch, each slice's output copied into the whole one: the
        peak is the whole float64 output and one slice's forward."""
        rows = batch_rows(pristine)
        step = -(-rows // self.chunks)
        out, several = None, False
        for i in range(0, rows, step):
            part = self.r64(*as_float64(_rows(pristine, i, i + step), device))
            several = isinstance(part, (tuple, list))
            if out is None:
                out = [torch.empty((rows, *p.shape[1:]), dtype=p.dtype, device=p.device) for p in _as_list(part)]
            for o, p in zip(out, _as_list(part)):
                o[i:i + p.shape[0]].copy_(p)
            del part
        return tuple(out) if several else out[0]

    def _rows_apart(self, pristine: list, r32) -> str | None:
        """Why the float64 forward cannot run slice by slice of the batch, or None: it must hold no state (buffers
        a second slice would update again), every input and output must be rows of one batch, and the fp32
        reference on the first slice must give the rows it gave on the whole batch (within ABS_FLOOR, or one rounding
        in fp16/bf16: a model that mixes rows, a batch norm or a sum over the batch, differs far more)."""
        if any(True for _ in self.r32.buffers()):
            return "the reference holds buffers"
        rows = batch_rows(pristine)
        outs = _as_list(r32)
        if rows < 2 or any(not isinstance(o, torch.Tensor) or o.dim() == 0 or o.shape[0] != rows for o in outs):
            return "its inputs and outputs are not rows of one batch"
        step = -(-rows // self.chunks)
        try:
            with torch.no_grad():
                part = _as_list(self.r32(*[clone_layout(x) for x in _rows(pristine, 0, step)]))
        except Exception as e:
            return f"the fp32 reference raised {type(e).__name__} on a slice of the batch"
        for p, o in zip(part, outs):
            e = rel_error(p, o[:step]) if p.shape == o[:step].shape else None  # worked in float64 blocks
            if e is None or e.nonfinite_mismatch or e.rel_l2 > dtype_floor(p.dtype):  # one rounding in fp16/bf16
                return "the fp32 reference gives other rows on a slice of the batch than on the whole"
        return None

    def expected(self, pristine: list, precision: str) -> Expected:
        from torch.utils.flop_counter import FlopCounterMode
        set_precision(precision)
        try:
            counter, reductions = FlopCounterMode(display=False), ReductionLength()
            before = None if self._state_calls >= 2 else \
                {k: v.detach().clone() for k, (_, _, v) in _named_plain(self.r32).items()}
            with torch.no_grad(), counter, reductions:
                r32 = self.r32(*[clone_layout(x) for x in pristine])
            if before is not None:
                self._state_calls += 1
                self.state_attrs = sorted(k for k, (_, _, v) in _named_plain(self.r32).items()
                                          if k not in before or not _same_buffer(v.detach(), before[k]))
            if self.chunks > 1 and self.chunk_proof is None:
                why = self._rows_apart(pristine, r32)
                self.chunk_proof = why or f"in {self.chunks} slices of the batch"
                if why:
                    self.chunks = 1
                    self.to_host()
                    self.moved = f"on the host: its forward does not fit the GPU whole and cannot be sliced ({why})"
            alts = self._other_algorithms(pristine, counter) if precision != "tf32" else []  # fp32, bf16, fp16
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
        return Expected.of(r32, r64, k=self.k, alts=alts)  # PyTorch's error: the worst of its legal algorithms


def _layouts_other(x):
    """x in the channels-last layout of its rank (4-D or 5-D floating tensors; anything else as it is)."""
    if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dim() in (4, 5):
        return x.contiguous(memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)
    return clone_layout(x) if isinstance(x, torch.Tensor) else x


def plain_tensors(model: torch.nn.Module) -> list:
    """(submodule, attribute name, tensor) for every plain tensor attribute of the model's submodules: tensors
    it holds that are neither parameters nor buffers."""
    return [(sub, k, v) for sub in model.modules() for k, v in vars(sub).items() if isinstance(v, torch.Tensor)]


def _named_plain(model: torch.nn.Module) -> dict:
    """plain_tensors by dotted name ("hidden", "cell.h0")."""
    names = {id(sub): n for n, sub in model.named_modules()}
    return {(f"{names[id(sub)]}." if names[id(sub)] else "") + k: (sub, k, v) for sub, k, v in plain_tensors(model)}


def _rows(xs: list, start: int, stop: int) -> list:
    """Rows start:stop of every batched input (a 0-dim tensor or a non-tensor argument whole)."""
    return [x[start:stop] if isinstance(x, torch.Tensor) and x.dim() > 0 else x for x in xs]


@dataclasses.dataclass
class Expected:
    """What a call must return: per output element the float64 reference and the budget from PyTorch's own fp32
    error on the same inputs (or, for a non-tensor element, the value itself)."""
    is_tuple: bool
    specs: list  # per element: (shape, dtype, device) of PyTorch's fp32 output, or the non-tensor value
    r64: list
    errs: list  # per element: (PyTorch's own Err, budget Err), None for a non-tensor element

    @classmethod
    def of(cls, r32, r64, fp32_only: bool = False, k: float = 1.0, alts: list = ()) -> "Expected":
        """fp32_only: r64 is PyTorch's fp32 output itself (no float64 reference could be made); the budget is then
        kp.judge.float64.FP32_ONLY_BUDGET. k: the reduction length behind each output element (the budget's floor).
        alts: PyTorch's fp32 outputs under its other legal algorithms; its own error is the worst of them all."""
        alts = [_as_list(a) for a in alts]
        r32l, r64l = _as_list(r32), _as_list(r64)
        specs, errs = [], []
        for i, (a, b) in enumerate(zip(r32l, r64l)):
            if isinstance(a, torch.Tensor) and fp32_only:
                specs.append((tuple(a.shape), a.dtype, a.device))
                b = fp32_only_budget(a.dtype)
                errs.append((Err(0.0, 0.0, 0), Err(b, b, 0)))
            elif isinstance(a, torch.Tensor):
                e = rel_error(a, b)
                for alt in alts:  # the worst of PyTorch's algorithms, where each stays NaN/Inf-exact
                    ea = rel_error(alt[i], b) if alt[i].shape == a.shape else None
                    if ea is not None and not ea.nonfinite_mismatch:
                        e = Err(max(e.rel_l2, ea.rel_l2), max(e.worst_row, ea.worst_row), e.nonfinite_mismatch)
                specs.append((tuple(a.shape), a.dtype, a.device))
                errs.append((e, budget_from(e, k, a.dtype)))  # the floor of the dtype PyTorch returns
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
        for e, spec in zip(self.errs, self.specs):
            if e is None:
                continue
            name = dtype_name(spec[1])
            if e[0].nonfinite_mismatch:
                return f"PyTorch {name} itself gets {e[0].nonfinite_mismatch} NaN/Inf positions wrong (it overflows)"
            if e[0].rel_l2 > torch_fair_max(spec[1]):
                return f"PyTorch {name} itself is off by relL2 {e[0].rel_l2:.1e}"
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


ALLCLOSE_CHUNK = 1 << 26  # elements compared at a time by _allclose: its temporaries stay ~1.5 GB whatever the size


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
        for i0 in range(0, wf.numel(), ALLCLOSE_CHUNK):
            gc, wc = gf[i0:i0 + ALLCLOSE_CHUNK], wf[i0:i0 + ALLCLOSE_CHUNK]
            d, a = (gc - wc).abs(), wc.abs()
            same, finite = gc == wc, torch.isfinite(d)  # a NaN or infinite difference is close only between equals
            for i, tol in enumerate(tols):
                close[i] = close[i] and bool((same | (finite & (d <= tol + tol * a))).all())
            if d.numel():  # as the whole tensor's nan_to_num said it: NaN as inf, inf as the largest float64
                worst = max(worst or 0.0, float(d.double().nan_to_num(float("inf")).max()))
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


def _release():
    """Hand cached GPU memory back: a candidate's worker shares the device and needs room for its own."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
