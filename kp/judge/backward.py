"""Gradients judged (`--backward`): every parity call also runs a backward pass from an upstream gradient drawn fresh
for that call, and the gradient of every floating input and of every parameter the reference trains is compared
with the reference's, in float64, under the forward's budget model: PyTorch fp32's own error on the same call times
the same factor, floored by the reduction length behind each gradient element, overall and for the worst row.

The reduction behind a gradient element is at least the forward's (the backward of a product of length K sums K
terms into each input's gradient too) and at least the outputs each element of it gathers from (a bias's gradient
sums the whole batch): the floor's K is the larger of the forward's and the output's elements over the gradient's.

Gradients accumulate as PyTorch's do: at the second call of the sequence the parameters' .grad is not cleared, and
what it must hold is the sum of both calls' gradients (a backward that assigns .grad instead of adding fails there).
The candidate's worker side is kp.worker.backward_pass; this side is GradientCheck, a part of the judge built from what
it reads."""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import torch

from kp.errors import Rejected
from kp.judge.outputs import _release, error_figures
from kp.judge.float64 import as_float64, float64_default
from kp.worker.backward_pass import leaves
from kp.lib.layers import set_precision
from kp.lib.numerics import Err, budget_from, clone_layout, rel_error
from kp.lib.op_modes import ReductionLength, RoundingNoise

UPSTREAM_SEED = 7919  # the upstream gradient's seed: the call's input seed plus this
BACKWARD_MARK = ": backward (upstream seed"  # in every rejection of a call's gradients


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
    # ({("input", i) or ("param", name): Err}), asked where one is over its budget (BackwardCheck._gradient_widener)
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

    def expected(self, refs, pristine: list, seed: int, precision: str) -> Grads | None:
        """Both references' gradients on this call's inputs, from an upstream gradient drawn from `seed` (printed
        seeds replay it), before the call itself: the references' state (BatchNorm's running statistics) is put back
        after, so the call that follows moves it once. None, said once, where no float64 gradient can be made."""
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
                return self.no_backward("the reference's output does not require grad: nothing to train")
            with reductions:
                gi32, gp32 = _grads(refs.r32, xs32, ys32, ups)
            out_n = max(sum(y.numel() for y in ys32 if isinstance(y, torch.Tensor)), 1)
            del xs32, ys32  # the fp32 forward's inputs and outputs: room for the float64 backward
            refs.restore_buffers(saved)
            if refs.fp32_only():
                return self.no_backward(f"no float64 reference ({refs.how})")
            for attempt in range(2):
                try:
                    gi64, gp64 = _float64_grads(refs, pristine, ups)
                except torch.OutOfMemoryError:
                    refs.restore_buffers(saved)  # a forward that ran before the backward ran short moved them
                else:
                    break
                if attempt:  # (outside the except: its traceback no longer holds the run's tensors)
                    return self.no_backward("where the float64 backward did not fit the GPU's memory")
                _release(collect=True)  # once: garbage collected, the judge's cached blocks handed back
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

    def widener(self, refs, pristine: list, exp: Grads, state: dict | None):
        """A function giving, once computed, the most each float64 gradient of this call moves over three runs of
        the float64 forward and backward with every operator's result rounded at random as an honest fp32 kernel may
        round it (kp.lib.op_modes.RoundingNoise): {("input", i) or ("param", name): Err against the float64
        gradient}; {} where the runs cannot be made. Each run starts from `state` (the references' state before the
        call, save_buffers) where given; the references' state is put back after each run. It holds `exp`'s parts,
        never `exp`, which holds it: a cycle would keep each call's gradients alive until Python's next full garbage
        collection (30 GiB at the softmax's benchmark shape)."""
        upstream, inputs, params = exp.upstream, exp.inputs, exp.params

        @functools.cache
        def widen() -> dict:
            out: dict = {}
            try:
                with self.clock.timed("parity: how far honest roundings move the float64 gradients"):
                    for seed in range(3):
                        saved = refs.save_buffers()
                        try:
                            if state is not None:
                                refs.restore_buffers(state)
                            gi, gp = _float64_grads(refs, pristine, upstream, RoundingNoise(seed))
                        finally:
                            refs.restore_buffers(saved)
                        moved = [(("input", i), g, inputs.get(i)) for i, g in gi.items()]
                        moved += [(("param", n), g, params.get(n)) for n, g in gp.items()]
                        for key, g, want in moved:
                            if want is not None and g.shape == want[1].shape:
                                e, was = rel_error(g.to(want[1].device), want[1]), out.get(key, Err(0.0, 0.0, 0))
                                out[key] = Err(max(was.rel_l2, e.rel_l2), max(was.worst_row, e.worst_row), 0)
            except Exception:  # no room for its runs, or the reference under the rounding mode: budgets as they were
                out = {}
            return out

        return widen

    def no_backward(self, why: str) -> None:
        note = f"gradients not checked: {why}"
        if note not in self.notes:
            self.notes.append(note)
            self.log(f"{self.name}: {note}")
        return None

    def check(self, row, label: str, got: dict | None, exp: Grads) -> dict:
        """A row's gradients against the references': every one the reference has must be there, of its shape and
        within its budget. Returns each gradient's relL2."""
        where = (
            f"{label}{BACKWARD_MARK} {exp.seed}"
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
            e_ref = rel_error(g32, g64)
            budget = budget_from(e_ref, k, g32.dtype)
            e = rel_error(g.to(g32.device), g64)
            moved = exp.widen().get(key) if exp.widen and exp.zero and not e.within(budget) else None
            if moved is not None and e.nonfinite_mismatch == 0:  # within how far honest roundings move it there?
                wide = budget_from(
                    Err(max(e_ref.rel_l2, moved.rel_l2), max(e_ref.worst_row, moved.worst_row), 0), k, g32.dtype
                )
                if e.within(wide):
                    self.notes.append(
                        f"{row.label} at {label}: the gradient of {what} over its budget, within how "
                        f"far honest fp32 roundings move the reference's there (relL2 {e.rel_l2:.2e}, "
                        f"worst row {e.worst_row:.2e}, row budget {wide.worst_row:.2e})"
                    )
                    budget = wide
            figs = error_figures(f"{where}: the gradient of {what}", e, budget, e_ref)
            if e.nonfinite_mismatch:
                raise Rejected(
                    f"{where}: the gradient of {what} has {e.nonfinite_mismatch} NaN/Inf positions that "
                    f"differ from the reference's",
                    figures=figs,
                    kind="gradient",
                )
            if not e.within(budget):
                raise Rejected(
                    f"{where}: the gradient of {what}: relL2 {e.rel_l2:.2e} over budget "
                    f"{budget.rel_l2:.2e} (worst row {e.worst_row:.2e}, row budget {budget.worst_row:.2e})",
                    figures=figs,
                    kind="gradient",
                )
            errs[what] = e.rel_l2
        return errs
