"""What one judged call must return and how it is judged: the row being judged, the fp32 and float64 references
it is compared with, the expected output and its budget, and the verdict on an output."""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from kp.errors import Rejected, failed_check, failed_figures, failure_kind, failure_record, first_line
from kp.judge.float64 import Promote, as_float64, float64_copy, float64_default, hold_on
from kp.lib.layers import set_precision
from kp.lib.numerics import batch_rows, clone_layout, dtype_floor, rel_error
from kp.lib.op_modes import FlopCount, ReductionLength, TruncatedTF32, reduction_length
from kp.judge.compare import spread_over_roundings
from kp.judge.outputs import FEW_ELEMENTS, Expected
from kp.judge.release import release_cached
from kp.judge.reference import Reference, _as_list, apply_update

FLOAT64, PROMOTED = "float64", "float64, every torch op's floating arguments promoted"


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
    library_kernels: list = dataclasses.field(default_factory=list)  # installed libraries' JIT kernels that ran
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
    # A rejection as data (the record's failure): its kind (kp.errors.FAILURE_KINDS), the stage it came in (the
    # driver names it as the stage ends), the failed check's label and figures
    failure: dict | None = None

    def reject(self, reason: Rejected) -> None:
        """Reject with the Rejected raised: its reason, kind and figures, and its traceback if it carries one."""
        if self.accepted:
            self.accepted, self.reason = False, str(reason)
            self.traceback = getattr(reason, "traceback", None)
            figs = failed_figures(reason)
            check = failed_check(reason)
            if figs:  # the failed check's numbers in the record beside the passed checks', not in the reason alone
                figs = dict(figs)
                check = figs.pop("check")
                self.checks[check] = {**figs, "passed": False}
            self.failure = failure_record(failure_kind(reason), check=check, figures=figs or None)
            if getattr(reason, "asks_for_cuda", False):  # the host's lack (no CUDA here), said as such by the driver
                self.failure["needs"] = "cuda"


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
    return (
        name == "num_batches_tracked" and isinstance(m, torch.nn.modules.batchnorm._NormBase) and m.momentum is not None
    )


class _Refs:
    """The fp32 and float64 reference models, carrying state (BatchNorm running statistics) across calls like the
    judged models, with the same weight changes applied. `how` says what the float64 side is: FLOAT64, PROMOTED
    (kp.judge.float64.Promote), or 'fp32 only: <why>' when no float64 reference could be run."""

    def __init__(
        self, ref: Reference, init, seed: int, device: str, f64_device: str, train: bool = True, chunks: int = 1
    ):
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
        # At a member of the shape family (--shapes), each output's RMS magnitude at the benchmark's shape: where the
        # member's output has a few elements only, its floor is taken against that magnitude (Expected.of: scale).
        self.bench_rms: list | None = None
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
        out = {
            k: b.clone() for m in (self.r32, self.r64) for k, b in ((f"{id(m)}:{n}", b) for n, b in m.named_buffers())
        }
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

    def to_host(self, why: str) -> None:
        """The float64 reference to the host from here on, its GPU memory handed back; `why` goes to the verdict's
        notes."""
        self.r64, self.f64_device = hold_on(self.r64, "cpu"), "cpu"
        self.moved = why
        release_cached()

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
        self.to_host("moved to the host after the GPU ran out of memory in its forward")
        return self._float64_try(pristine, "cpu")

    def _float64_try(self, pristine: list, device: str):
        while not self.fp32_only():
            saved = {k: b.clone() for k, b in self.r64.named_buffers()}
            try:
                with (
                    torch.no_grad(),
                    float64_default(),
                    Promote() if self.how == PROMOTED else contextlib.nullcontext(),
                ):
                    if self.chunks > 1:
                        return self._by_rows(pristine, device)
                    return self.r64(*as_float64(pristine, device))
            except Exception as e:
                with torch.no_grad():
                    for k, b in self.r64.named_buffers():
                        b.copy_(saved[k])
                if isinstance(e, torch.OutOfMemoryError):
                    raise
                self.how = (
                    PROMOTED
                    if self.how == FLOAT64
                    else f"fp32 only: the float64 copy raised {type(e).__name__}: {first_line(e)[:160]}"
                )
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
                o[i : i + p.shape[0]].copy_(p)
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

    def expected(self, pristine: list, precision: str, grow: float = 1.0) -> Expected:
        """PyTorch's fp32 output and the float64 reference on these inputs, with the budgets (grow: how much the
        budget's floor grows, at the shifted derived input, kp.judge.parity.shift_growth)."""
        set_precision(precision)
        try:
            counter, reductions = FlopCount(), ReductionLength()
            before = (
                None
                if self._state_calls >= 2
                else {k: v.detach().clone() for k, (_, _, v) in _named_plain(self.r32).items()}
            )
            with torch.no_grad(), counter, reductions:
                r32 = self.r32(*[clone_layout(x) for x in pristine])
            _settled()  # a fault of the reference's kernels surfaces here, as the reference's, not at a later line
            if before is not None:
                self._state_calls += 1
                self.state_attrs = sorted(
                    k
                    for k, (_, _, v) in _named_plain(self.r32).items()
                    if k not in before or not _same_buffer(v.detach(), before[k])
                )
            if self.chunks > 1 and self.chunk_proof is None:
                why = self._rows_apart(pristine, r32)
                self.chunk_proof = why or f"in {self.chunks} slices of the batch"
                if why:
                    self.chunks = 1
                    self.to_host(f"on the host: its forward does not fit the GPU whole and cannot be sliced ({why})")
            # fp32, bf16, fp16: PyTorch's other algorithms; tf32: TF32 tensor cores fed fp32 inputs as they are
            alts = (
                other_algorithms(self, pristine, counter)
                if precision != "tf32"
                else tf32_truncating(self, pristine, counter)
            )
            r64 = self._float64(pristine)
            _settled()
        finally:
            set_precision("fp32")
        numel = lambda ts: sum(t.numel() for t in ts if isinstance(t, torch.Tensor) and t.is_floating_point())
        self.k = max(
            reductions.k,
            reduction_length(
                counter.get_total_flops(), max((numel([x]) for x in pristine), default=0), numel(_as_list(r32))
            ),
        )
        if r64 is None:
            return Expected.of(r32, r32, fp32_only=True)
        if self.f64_device == "cpu" and torch.cuda.is_available():  # pinned: each chunk of the comparison crosses
            r64 = (
                tuple(t.pin_memory() if isinstance(t, torch.Tensor) else t for t in _as_list(r64))
                if isinstance(r64, (tuple, list))
                else r64.pin_memory()
            )  # PCIe at full speed
        spread = rounding_spread(self, pristine, r64) if self.bench_rms is not None else None
        return Expected.of(
            r32,
            r64,
            k=self.k,
            alts=alts,  # PyTorch's error: the worst of its legal algorithms
            scale=self.bench_rms,
            spread=spread,
            grow=grow,
        )


def rounding_spread(refs: "_Refs", pristine: list, r64) -> list | None:
    """At a member of the shape family, for each output of a few elements (FEW_ELEMENTS): how far honest fp32
    roundings move it relative to its value (kp.judge.compare.spread_over_roundings' relL2). A loss that is the
    difference of two distances near 90 (a triplet margin loss at a batch of one) moves far more than its own value's
    floor says; an honest kernel was rejected there. None where no output is that small."""
    outs = _as_list(r64)
    few = {
        i: t
        for i, t in enumerate(outs)
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() <= FEW_ELEMENTS
    }
    if not few:
        return None
    moves = spread_over_roundings(refs, None, float64_again(refs, pristine), few)
    return None if moves is None else [moves[i].rel_l2 if i in moves else None for i in range(len(outs))]


def float64_again(refs: "_Refs", pristine: list):
    """The float64 reference's call on these inputs once more, under the rounding mode it is given: its outputs by
    index, None where the float64 reference cannot be run again (what kp.judge.compare's widener runs)."""

    def again(noise) -> dict | None:
        with noise:
            other = refs._float64(pristine)
        return None if other is None else dict(enumerate(_as_list(other)))

    return again


def _ops_run(counter) -> set[str]:
    """The operators of the forward FlopCount saw, by name."""
    return {str(op) for counts in counter.get_flop_counts().values() for op in counts}


def _has_products(counter) -> bool:
    """Whether the forward FlopCount saw ran a GEMM, a matrix-vector product or a convolution."""
    return any(name in op for op in _ops_run(counter) for name in ("mm", "addmv", "mv", "convolution"))


def tf32_truncated_output(refs: "_Refs", pristine: list):
    """The fp32 reference's output on these inputs with every product's multiplicands truncated to TF32
    (kp.lib.op_modes.TruncatedTF32), its state and the TF32 switches put back after; None where no product ran or
    it cannot be run."""
    saved = refs.save_buffers()
    switches = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    mode = TruncatedTF32()
    try:
        set_precision("fp32")  # TF32 off: the truncated multiplicands' products are exact
        with torch.no_grad(), mode:
            y = refs.r32(*[clone_layout(x) for x in pristine])
        _settled()
    except Exception:  # the reference under the mode: no second algorithm to weigh
        return None
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = switches
        refs.restore_buffers(saved)
    return y if mode.hit else None


def tf32_truncating(refs: "_Refs", pristine: list, counter) -> list:
    """In the tf32 mode, beside PyTorch's own TF32 (cuBLAS rounds the fp32 inputs to TF32): the same products with
    their inputs truncated, as TF32 tensor cores read fp32 operands handed to them as they are (Triton's tl.dot by
    default), which errs about twice as much. Both are TF32 arithmetic, so PyTorch's error (the budget's base) is
    the worse of the two. Nothing where the forward runs no product."""
    y = tf32_truncated_output(refs, pristine) if _has_products(counter) else None
    return [] if y is None else [y]


def other_algorithms(refs: "_Refs", pristine: list, counter) -> list:
    """The reference's output under PyTorch's other legal choices of algorithm, for a call that runs a cuDNN
    convolution on the GPU: cuDNN's autotuner on (cudnn.benchmark) and the inputs in channels-last layout, which
    select other algorithms of the judged dtype (fp32, bf16, fp16) with other summation orders. A candidate may make
    either choice, so PyTorch's own error (the budget's base) is the worst of these on the same inputs. The
    references' state (buffers, plain tensor attributes) is put back after each run: these calls are not in the
    sequence."""
    if not any(isinstance(x, torch.Tensor) and x.is_cuda for x in pristine):
        return []
    if not any("convolution" in op for op in _ops_run(counter)):
        return []
    out = []
    for channels_last in (False, True):
        saved = refs.save_buffers()
        old = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = True
        try:
            with torch.no_grad():
                xs = [
                    _layouts_other(x) if channels_last else clone_layout(x) if isinstance(x, torch.Tensor) else x
                    for x in pristine
                ]
                y = refs.r32(*xs)
            out.append(
                tuple(t.contiguous() if isinstance(t, torch.Tensor) else t for t in _as_list(y))
                if isinstance(y, (tuple, list))
                else y.contiguous()
            )
        except Exception:
            pass  # an algorithm PyTorch cannot run here is no choice a candidate has
        finally:
            torch.backends.cudnn.benchmark = old
            refs.restore_buffers(saved)
    return out


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


def _settled() -> None:
    """Waits for the GPU work queued so far in this process (the reference's), where CUDA is in use: a device-side
    assert or an illegal address in its kernels is raised asynchronously, at whatever line next waits for the GPU;
    waited for here, it is raised inside the reference's call, where the judge says it is the reference's."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
