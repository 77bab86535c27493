"""Gradients judged (`--backward`): every parity call also runs a backward pass from an upstream gradient drawn fresh
for that call, and the gradient of every floating input and of every parameter the reference trains is compared
with the reference's, in float64, under the forward's budget model: PyTorch fp32's own error on the same call times
the same factor, floored by the reduction length behind each gradient element, overall and for the worst row.

The reduction behind a gradient element is at least the forward's (the backward of a product of length K sums K
terms into each input's gradient too) and at least the outputs each element of it gathers from (a bias's gradient
sums the whole batch): the floor's K is the larger of the forward's and the output's elements over the gradient's.

Gradients accumulate as PyTorch's do: at the second call of the sequence (ACCUMULATES_AT) the parameters' .grad is not
cleared, and what it must hold is the sum of both calls' gradients (a backward that assigns .grad instead of adding
fails there): GradientSequence keeps that rule over one sequence of calls. Each gradient is compared as an output is,
by kp.judge.compare, with the same widener at a derived input or a declared case. The candidate's worker side is
kp.worker.backward_pass; this side is GradientCheck, a part of the judge built from what it reads."""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from kp.errors import Rejected
from kp.judge.compare import Budget, compare, widener
from kp.judge.release import release_cached
from kp.judge.float64 import as_float64, float64_default
from kp.worker.backward_pass import leaves
from kp.lib.layers import set_precision
from kp.lib.numerics import clone_layout, rel_error
from kp.lib.op_modes import ReductionLength

UPSTREAM_SEED = 7919  # the upstream gradient's seed: the call's input seed plus this
ACCUMULATES_AT = 1  # the index of the call of a sequence whose backward adds to the call before's .grad


@dataclasses.dataclass
class Grads:
    """What one call's backward must give: the upstream gradients sent with the call, and per gradient (an input's
    index or a reference parameter's name) PyTorch's fp32 gradient, the float64 one and the floor's K."""

    upstream: list
    seed: int
    inputs: dict  # index -> (g32, g64, k)
    params: dict  # reference name -> (g32, g64, k)
    zero: bool = True  # the parameters' .grad cleared before this call's backward
    # at a derived input or a declared case: a function giving how far honest fp32 roundings move each float64 gradient
    # ({("input", i) or ("param", name): Err}), asked where one is over its budget (GradientCheck.widener)
    widen: object = None

    def request(self) -> dict:
        return {"upstream": self.upstream, "zero": self.zero}

    def plus(self, before: "Grads | None") -> "Grads":
        """This call's expectations with the parameters' gradients of the call before added (accumulation)."""
        if before is None:
            return self
        params = {
            k: (a[0] + before.params[k][0].to(a[0].device), a[1] + before.params[k][1].to(a[1].device), a[2])
            for k, a in self.params.items()
            if k in before.params
        }
        return dataclasses.replace(self, params=params, zero=False)

    def float64(self) -> dict:
        """Every float64 gradient, by its key: ("input", i) or ("param", name)."""
        return {("input", i): g[1] for i, g in self.inputs.items()} | {
            ("param", n): g[1] for n, g in self.params.items()
        }


class GradientSequence:
    """The expected gradients of one sequence of checked calls, call by call: at the call ACCUMULATES_AT the
    parameters' .grad is not cleared, so what it must hold is its own gradients plus the call before's."""

    def __init__(self):
        self.before: Grads | None = None

    def at(self, index: int, grads: Grads | None) -> Grads | None:
        """The gradients call `index` of the sequence must give (its own, from GradientCheck.expected)."""
        if grads is not None and index == ACCUMULATES_AT:
            grads = grads.plus(self.before)
        self.before = grads
        return grads


def _outs(y) -> list:
    return list(y) if isinstance(y, (tuple, list)) else [y]


def _grads(model, xs: list, ys: list, ups: list) -> tuple[dict, dict]:
    pairs = [(y, g) for y, g in zip(ys, ups) if g is not None and y.requires_grad]
    for p in model.parameters():
        p.grad = None
    torch.autograd.backward([y for y, _ in pairs], [g.to(y.device, y.dtype) for y, g in pairs])
    gi = {i: x.grad.detach() for i, x in enumerate(xs) if isinstance(x, torch.Tensor) and x.grad is not None}
    gp = {k: p.grad.detach() for k, p in model.named_parameters() if p.requires_grad and p.grad is not None}
    for p in model.parameters():
        p.grad = None
    return gi, gp


def _float64_grads(refs, pristine: list, upstream: list, rounding=None) -> tuple[dict, dict]:
    """The float64 reference's gradients of one call from the upstream gradients sent with it (rounding: a
    RoundingNoise its forward and backward run under)."""
    ups = [u.double() if u is not None else None for u in upstream]
    with float64_default():
        xs64 = leaves(as_float64(pristine, refs.f64_device))
        with rounding or contextlib.nullcontext(), torch.enable_grad():
            return _grads(refs.r64, xs64, _outs(refs.r64(*xs64)), ups)


class GradientCheck:
    """The gradients' part of the judge (--backward): the references' backward on a call's inputs (expected), how
    far honest roundings move it (widener), and a row's gradients against it (check). What it reads is given once,
    by the judge's construction: the judge's notes (where a gradient not checked is said, once), its log, the
    reference's name and the stage clock."""

    def __init__(self, notes: list, log, name: str, clock):
        self.notes, self.log, self.name, self.clock = notes, log, name, clock
        self.unchecked: dict[str, list[str]] = {}  # why gradients were not checked: at which calls

    def expected(self, refs, pristine: list, seed: int, precision: str, at: str | None = None) -> Grads | None:
        """Both references' gradients on this call's inputs, from an upstream gradient drawn from `seed` (printed
        seeds replay it), before the call itself: the references' state (BatchNorm's running statistics) is put back
        after, so the call that follows moves it once. None where no float64 gradient can be made, said in one note
        for each reason with the calls (`at`: this call's label) it held at."""
        saved = refs.save_buffers()
        try:
            set_precision(precision)
            xs32 = leaves([clone_layout(x) for x in pristine])
            reductions = ReductionLength()  # the longest reduction of the forward and of its backward: the floor's K
            with torch.enable_grad(), reductions:
                ys32 = _outs(refs.r32(*xs32))
            gen = torch.Generator(device=ys32[0].device if isinstance(ys32[0], torch.Tensor) else "cpu")
            gen.manual_seed(seed + UPSTREAM_SEED)
            ups = [
                torch.randn(y.shape, generator=gen, device=y.device, dtype=torch.float32).to(y.dtype)
                if isinstance(y, torch.Tensor) and y.is_floating_point() and y.requires_grad
                else None
                for y in ys32
            ]
            if not any(u is not None for u in ups):
                return self.no_backward("the reference's output does not require grad: nothing to train", at)
            with reductions:
                gi32, gp32 = _grads(refs.r32, xs32, ys32, ups)
            out_n = max(sum(y.numel() for y in ys32 if isinstance(y, torch.Tensor)), 1)
            del xs32, ys32  # the fp32 forward's inputs and outputs: room for the float64 backward
            refs.restore_buffers(saved)
            if refs.fp32_only():
                return self.no_backward(f"no float64 reference ({refs.how})", at)
            got = self._float64_grads_with_room(refs, pristine, ups, saved)
            if got is None:
                return self.no_backward("the float64 backward did not fit the GPU's memory", at)
            gi64, gp64 = got
        finally:
            refs.restore_buffers(saved)
            set_precision("fp32")
        k = lambda g: max(reductions.k, out_n / max(g.numel(), 1))
        return Grads(
            upstream=ups,
            seed=seed + UPSTREAM_SEED,
            inputs={i: (g, gi64[i], k(g)) for i, g in gi32.items() if i in gi64},
            params={n: (g, gp64[n], k(g)) for n, g in gp32.items() if n in gp64},
        )

    @staticmethod
    def _float64_grads_with_room(refs, pristine: list, ups: list, saved: dict) -> tuple[dict, dict] | None:
        """The float64 gradients where they fit: on the GPU, tried again once after a garbage collection hands the
        judge's cached blocks back, then on the host, which has room, the float64 reference kept there from then on
        and the verdict's notes saying why (an estimate short of the backward's peak, or another process's
        memory). None where the float64 reference is on the host already and its backward ran the GPU short."""
        for attempt in range(2):
            try:
                return _float64_grads(refs, pristine, ups)
            except torch.OutOfMemoryError:
                refs.restore_buffers(saved)  # a forward that ran before the backward ran short moved them
            if not attempt:  # (outside the except: its traceback no longer holds the run's tensors)
                release_cached(collect=True)
        if refs.f64_device == "cpu":
            return None
        refs.to_host("moved to the host after the GPU ran out of memory in its backward")
        return _float64_grads(refs, pristine, ups)

    def widener(self, refs, pristine: list, exp: Grads, state: dict | None):
        """The call's widener (kp.judge.compare.widener): how far each float64 gradient moves over the float64
        forward and backward run again under random roundings, from `state` (the references' state before the
        call) where given; {} where the runs cannot be made."""
        upstream = exp.upstream

        def again(noise) -> dict:
            gi, gp = _float64_grads(refs, pristine, upstream, noise)
            return {("input", i): g for i, g in gi.items()} | {("param", n): g for n, g in gp.items()}

        return widener(self.clock.timed, "the float64 gradients", refs, state, again, exp.float64())

    def no_backward(self, why: str, at: str | None = None) -> None:
        """Gradients not checked for `why`, at the call labelled `at` where it is one call's: one note for each
        reason, naming every call it held at (their labels up to the seed), kept up to date in place."""
        calls = self.unchecked.setdefault(why, [])
        before = self._note(why, calls)  # the note as it stands, if this reason was met before
        short = at.split(" (seed")[0] if at else None
        if short and short not in calls:
            calls.append(short)
        note = self._note(why, calls)
        if before in self.notes:
            self.notes[self.notes.index(before)] = note
        elif note not in self.notes:
            self.notes.append(note)
            self.log(f"{self.name}: {note}")
        return None

    @staticmethod
    def _note(why: str, calls: list[str]) -> str:
        if not calls:
            return f"gradients not checked: {why}"
        return f"gradients not checked at {len(calls)} call{'s' if len(calls) > 1 else ''} ({', '.join(calls)}): {why}"

    def check(self, row, label: str, got: dict | None, exp: Grads) -> dict:
        """A row's gradients against the references': every one the reference has must be there, of its shape and
        within its budget. Returns each gradient's relL2."""
        where = (
            f"{label}: backward (upstream seed {exp.seed}"
            + ("" if exp.zero else ", .grad accumulated over this call and the one before")
            + ")"
        )
        if got is None:
            raise Rejected(f"{where}: the worker returned no gradients", kind="gradient")
        errs = {}
        names = row.names or {}
        if exp.params and not names:
            self.no_backward("the candidate's parameters do not map to the reference's by name or in order")
        checks = [
            (("input", i), f"input {i}", got["inputs"][i] if i < len(got["inputs"]) else None, e, True)
            for i, e in exp.inputs.items()
        ]
        checks += [
            (("param", n), f"parameter {names[n]!r}", got["params"].get(names[n]), e, names[n] in got["params"])
            for n, e in exp.params.items()
            if n in names
        ]
        for key, what, g, (g32, g64, k), trainable in checks:
            if g is None:
                why = "got no gradient" if trainable else "is not trainable in the model (it does not require grad)"
                raise Rejected(f"{where}: {what}, which the reference trains, {why}", kind="gradient")
            if tuple(g.shape) != tuple(g64.shape):
                raise Rejected(
                    f"{where}: the gradient of {what} has shape {tuple(g.shape)}, the reference's {tuple(g64.shape)}",
                    kind="gradient",
                )
            widen = (lambda key=key: exp.widen().get(key)) if exp.widen and exp.zero else None
            c = compare(g.to(g32.device), g64, Budget.of(rel_error(g32, g64), k, g32.dtype), widen)
            if c.widened and c.ok:
                self.notes.append(
                    f"{row.label} at {label}: the gradient of {what} over its budget, within how "
                    f"far honest fp32 roundings move the reference's there (relL2 {c.err.rel_l2:.2e}, "
                    f"worst row {c.err.worst_row:.2e}, row budget {c.budget.limit.worst_row:.2e})"
                )
            e, budget, figs = c.err, c.budget.limit, c.figures(f"{where}: the gradient of {what}")
            if e.nonfinite_mismatch:
                raise Rejected(
                    f"{where}: the gradient of {what} has {e.nonfinite_mismatch} NaN/Inf positions that "
                    f"differ from the reference's",
                    figures=figs,
                    kind="gradient",
                )
            if not c.ok:
                raise Rejected(
                    f"{where}: the gradient of {what}: relL2 {e.rel_l2:.2e} over budget "
                    f"{budget.rel_l2:.2e} (worst row {e.worst_row:.2e}, row budget {budget.worst_row:.2e})",
                    figures=figs,
                    kind="gradient",
                )
            errs[what] = e.rel_l2
        return errs
