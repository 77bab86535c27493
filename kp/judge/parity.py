"""The judge's parity stage (construct and what comes before it are kp.judge.construct; KernelBench's own check is
kp.judge.kernelbench): one stateful sequence of checked calls (trials with weight changes, derived inputs, declared
cases), each call checked the same way (kp.judge.calls.check_call) against the float64 reference; the hints a
first wrong call gets (the candidate's own initialisation, eval semantics). Functions of the judge's run
(kp.judge.driver.Judge); the stage that orders them is kp.judge.parity_stage."""

from __future__ import annotations

import dataclasses
import functools
import math

import torch

from kp.errors import ReferenceRaised, Rejected, failed_figures, first_line, raised_by_judge
from kp.judge.backward import GradientSequence
from kp.judge.calls import (
    STALE_INPUTS,
    check_buffers,
    check_call,
    in_retired_buffers,
    moved_call,
    release_if_short,
    room_to_move,
)
from kp.judge.compare import widener
from kp.judge.construct import build_row
from kp.judge.expected import Row, _Refs, float64_again, tf32_truncated_output
from kp.judge.float64 import FP32_ONLY_BUDGET
from kp.judge.options import MIN_TRIALS
from kp.judge.outputs import Expected, rms
from kp.judge.premises import Premises
from kp.judge.reference import UPDATES, _as_list, make_update, rename_update, trial_seeds
from kp.lib.numerics import all_finite, rel_error

# Inputs derived from the benchmark inputs (floating tensors only): a kernel that is right only for torch.rand's
# [0, 1) fails one of them (e.g. a softmax without the max subtraction overflows at x100).
# The shift is -10, not a small one, and its budget's floor grows with the inputs' RMS (shift_growth): an honest
# kernel's error grows with the shift, a numerically poor one's with its square (tools/shift_error.py: an instance
# norm of two plain sequential fp32 passes, 9.4e-5 at -10 against a floor of 3.1e-4 there, where a one-pass
# E[x^2] - mean^2 gives 1.2e-3; at -3 the two were 3.4e-5 and 7.6e-5, one on each side of no single budget).
DERIVED = {"negated": lambda x: -x, "scaled x100": lambda x: x * 100, "shifted -10": lambda x: x - 10}
SHIFT_GROWTH_MOST = 20.0  # the floor's growth at the shifted input at most (inputs of a tiny RMS)


def stale_cache_shaped(e: Rejected) -> bool:
    """Whether a rejection after the weights changed, of a row that passed before, has the shape of a value derived
    from the old weights: the whole output over its budget, or a check other than the budget failed. A row alone
    over its budget, the whole output within its own (l2_p86 of KernelBench's leaderboard: worst row 2.75e-06 over
    2.70e-06, relL2 half its budget), is the candidate's rounding near the margin at the new draw, and says so
    without naming a cache."""
    figs = failed_figures(e)
    return e.kind != "wrong_output" or not figs or figs["rel_l2"] > figs["budget"]


def shift_growth(base: list, derived: list) -> float:
    """How much the budget's floor grows at the shifted input: the floating inputs' RMS after the shift over before
    (an honest kernel rounds relative to the magnitudes it handles, and an output that does not move with the shift,
    a normalisation's, keeps that larger error), 1 to SHIFT_GROWTH_MOST."""
    before = after = 0.0
    for x, y in zip(base, derived):
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel():
            before += float(torch.linalg.vector_norm(x, dtype=torch.float64)) ** 2
            after += float(torch.linalg.vector_norm(y, dtype=torch.float64)) ** 2
    if not (before > 0 and math.isfinite(after)):
        return SHIFT_GROWTH_MOST if after > 0 else 1.0
    return min(SHIFT_GROWTH_MOST, max(1.0, (after / before) ** 0.5))


def _overflowed(base: list, derived: list) -> str | None:
    """Why a derived input is out of its dtype's range (finite values made infinite: x100 overflows fp16 from 655.4,
    where fp32 goes to 3.4e38), or None."""
    for x, y in zip(base, derived):
        if isinstance(x, torch.Tensor) and x.is_floating_point() and not all_finite(y) and all_finite(x):
            return (
                f"the derived input overflows {x.dtype} (its largest finite value is "
                f"{torch.finfo(x.dtype).max:.5g}), outside the problem's domain in this precision"
            )
    return None


def output_widener(run, refs: _Refs, pristine: list, exp: Expected, where: str, state: dict | None):
    """At a derived input or a declared case, where a row is over its budget: how far honest fp32 roundings move
    each output of the reference there (kp.judge.compare.widener, computed once for every row that needs it, from
    `state`, the references' state before the call; the budget stays as it was where it cannot be computed)."""
    return widener(
        run.clock.timed, f"the reference at {where}", refs, state, float64_again(refs, pristine), exp.floating()
    )


# A row's error within these multiples of the truncated-TF32 reference's: the signature of TF32 tensor cores fed fp32
# inputs (on KernelBench's GEMMs such candidates erred 6.5e-4 to 7.6e-4 where truncation errs about 7.6e-4)
TF32_SIGNATURE = (0.25, 4.0)


def tf32_hint(refs: _Refs, pristine: list, exp: Expected, e: Rejected) -> tuple[str, dict] | None:
    """An fp32 row over its budget by about what TF32 tensor cores fed fp32 inputs err: the cause in words and the
    figures with that error (tf32_rel_l2), or None. The error is measured here, on the call's own inputs: the fp32
    reference with its products' inputs truncated to TF32 (kp.judge.expected.tf32_truncated_output) against the
    float64 reference. The verdict stays a rejection: fp32 was asked for."""
    figs = failed_figures(e) or {}
    f64 = any(isinstance(t, torch.Tensor) and t.dtype == torch.float64 for t in exp.r64)  # else fp32 only: no error
    if e.kind != "wrong_output" or not f64 or "rel_l2" not in figs or "budget" not in figs:
        return None
    y = tf32_truncated_output(refs, pristine)
    if y is None:
        return None
    errs = [
        rel_error(o.to(w.device), w).rel_l2
        for o, w in zip(_as_list(y), exp.r64)
        if isinstance(o, torch.Tensor)
        and isinstance(w, torch.Tensor)
        and w.dtype == torch.float64
        and o.shape == w.shape
    ]
    t = max(errs, default=0.0)
    lo, hi = TF32_SIGNATURE
    if not (t > figs["budget"] and lo * t <= figs["rel_l2"] <= hi * t):
        return None
    return (
        f"its error is what TF32 tensor cores fed fp32 inputs err (the reference with its products' inputs "
        f"truncated to TF32 errs {t:.2e} here): Triton's tl.dot reads fp32 operands as TF32 unless told "
        f'otherwise; input_precision="ieee" (or "tf32x3") computes in fp32, or judge it with --precision tf32',
        {**figs, "tf32_rel_l2": t},
    )


def own_init_hint(run, row: Row, init, label: str, pristine: list, exp: Expected) -> str | None:
    """A row wrong with the reference's weights loaded, judged once more at its own same-seed initialisation
    (nothing loaded): when that passes, why it failed is that its parameters mean something else."""
    try:
        row.runner.call(label, "build", row.label, init, run.seed)
        check_call(run, row, label, pristine, exp)
    except Rejected:
        return None
    how = "by name" if all(k == v for k, v in row.names.items()) else "in order"
    return (
        f"right at its own same-seed initialisation, wrong with the reference's weights loaded {how}: its "
        f"parameters mean something else (e.g. pre-scaled, transposed or folded)"
    )


def eval_semantics_hint(run, row: Row, init, label: str, pristine: list) -> str | None:
    """A training-mode row wrong at its first call, judged once more against the reference in eval mode (a fresh
    one, as built): when that passes, the candidate normalises with running statistics where a training Model
    uses the batch's, the defect of BatchNorm folded or fused for inference, and the reason says so. Only the
    first call comes here, before any weight change: the reference's state as built is its state now with the
    buffers that call moved put back."""
    if not (
        run.train
        and any(
            isinstance(m, torch.nn.modules.batchnorm._NormBase) and m.track_running_stats
            for m in run.refs.r32.modules()
        )
    ):
        return None
    try:
        exp = _Refs(run.ref, init, run.seed, run.device, run.refs.f64_device, train=False).expected(
            pristine, run.precision
        )
        as_built = {**run.refs.state(), **run.refs.initial}
        build_row(run, row, run.refs, init, run.seed, stage=label, state=as_built)
        check_call(run, row, label, pristine, exp)
    except Rejected:
        return None
    return (
        "it matches the reference in eval mode: it normalises with BatchNorm's running statistics where a "
        "training-mode Model uses the batch's (--mode eval judges inference semantics)"
    )


def parity_sequence(run) -> list[tuple[str, int, str | None, str | None]]:
    """(label, input seed, weight change before the call, derived-input transform) of the stateful parity
    calls on benchmark-shape inputs."""
    seeds = trial_seeds(run.seed, run.trials + len(DERIVED))
    calls = []
    for i in range(run.trials):
        upd = UPDATES[(i - 1) % len(UPDATES)] if i else None
        calls.append((f"trial {i + 1} (seed {seeds[i]}{', after an ' + upd if upd else ''})", seeds[i], upd, None))
    for j, name in enumerate(DERIVED):
        s = seeds[run.trials + j]
        calls.append((f"inputs {name} (seed {s})", s, None, name))
    return calls


def parity_bench(run, init, at: str | None = None) -> None:
    """The stateful sequence of checked calls on the shape the reference's sizes have now: the benchmark's, or a
    member of its family (`at`: its shape, which every check's label starts with)."""
    with run.clock.timed("parity: the references (fp32 and its float64 copy) built"):
        refs = run.refs = _Refs(
            run.ref, init, run.seed, run.device, run.f64_device, run.train, chunks=max(run.f64_chunks, 1)
        )
    if at:  # a member's outputs of a few elements: their floor against the benchmark's magnitude (few_scale)
        refs.bench_rms = run.bench_rms
    else:
        run.bench_rms = None
    with run.clock.timed("construct: the rows built with the reference's weights"):
        run._each(lambda row: build_row(run, row, refs, init, run.seed))
    premises = Premises()  # what every trial's draw shares: the derived inputs keep it or are skipped
    passed_before = {}

    def check_row(row: Row, call: CheckedCall) -> None:
        try:
            row.checks[call.label] = check_call(
                run, row, call.label, call.inputs, call.exp, call.widen, moved=call.moved, grads=call.grads
            )
        except Rejected as e:
            if e.kind == "gradient":  # the forward was right: what follows explains a wrong forward
                raise
            explained = _explained(run, refs, row, e, call, init, passed_before.get(row.label, False))
            if explained is e:
                raise
            raise explained from explained.__cause__  # the stale inputs' keeps the rejection it explains
        passed_before[row.label] = True
        check_buffers(run, row, f"buffers after {call.label}", refs)

    gradients = GradientSequence()  # --backward: each call's expected gradients, accumulated where .grad is kept
    base_finite = None
    for index, (label, s, upd, derive) in enumerate(parity_sequence(run)):
        if not run.live():
            break
        label = f"at {at}: {label}" if at else label
        with run.clock.timed("parity: the weights changed alike on every side"):
            changed = upd and each_update(run, refs, upd, s)
        if upd and not changed:  # nothing to change: the call is a plain one and says so
            label = label.replace(f", after an {upd}", "")
        with run.clock.timed("parity: the inputs drawn"):
            drawn = _inputs(run, premises, label, run.ref.inputs(s, run.device), derive)
        if drawn is None:
            continue
        pristine, grow = drawn
        saved = refs.save_buffers() if derive else None  # a skipped call leaves the reference's state as it was
        expected = _expected(run, refs, label, pristine, s, derive, grow, saved)
        if expected is None:
            continue
        grads, exp = expected
        finite = exp.finite()
        if not at and run.bench_rms is None:  # the benchmark's first call: each output's typical magnitude
            run.bench_rms = [rms(t) if isinstance(t, torch.Tensor) and t.is_floating_point() else None for t in exp.r64]
        if base_finite is None:
            base_finite = finite
        why = None
        if derive and base_finite and not finite:
            why = "the float64 reference is not finite there"
        elif derive:
            why = exp.torch_unfair()
        if why:
            refs.restore_buffers(saved)
            run.skip(f"{label}: {why}")
            continue

        if not at:  # what no kernel computes, judged with this call's budgets (kp.judge.probes)
            with run.clock.timed("parity: the reference's probes"):
                run.probes.see(label, refs.r32, pristine, exp, run.fp["shapes"])
        widen = output_widener(run, refs, pristine, exp, "a derived input", saved)
        moved = moved_call(index) and room_to_move(run, pristine)
        if moved_call(index) and not moved:
            run.skip(
                f"{label}: its inputs at new addresses: no room for a second copy of them beside the "
                f"first (a graph captured on an earlier call's inputs is not checked at this call)"
            )

        grads = gradients.at(index, grads)
        if grads is not None and derive:  # a gradient over its budget there: widened as the output's is
            grads.widen = run.gradients.widener(refs, pristine, grads, saved)
        call = CheckedCall(label, pristine, exp, widen if derive else None, derive, upd, changed, moved, grads)

        with run.clock.timed("parity: the rows' benchmark-shape calls and their checks"):
            run._each(functools.partial(check_row, call=call))
        del pristine, exp, call
        with run.clock.timed("parity: the GPU's cached memory handed back"):
            release_if_short(run)
    premises.forget()
    run.notes += [n for n in _reference_notes(refs, at) if n not in run.notes]


@dataclasses.dataclass
class CheckedCall:
    """One call of the sequence as every row is checked at it: its label, inputs and expected outputs, the widener
    of a derived call's budget, what it derives or updates, whether the weights changed and the inputs moved, and
    the expected gradients (--backward)."""

    label: str
    inputs: list
    exp: Expected
    widen: object
    derive: str | None
    upd: str | None
    changed: bool
    moved: bool
    grads: object


def _inputs(run, premises: Premises, label: str, pristine: list, derive: str | None) -> tuple[list, float] | None:
    """The call's inputs: as drawn, or derived from them (DERIVED), with the growth of the budget's floor at a
    shifted input (shift_growth); None where a derived call cannot be made (said as a skip)."""
    if not derive:
        premises.see(pristine)
        return pristine, 1.0
    if not any(isinstance(x, torch.Tensor) and x.is_floating_point() for x in pristine):
        run.skip(f"{label}: no floating-point input to derive from")
        return None
    if premises.broken(derive):
        run.skip(f"{label}: {premises.broken(derive)}")
        return None
    derived = [DERIVED[derive](x) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in pristine]
    out_of_range = _overflowed(pristine, derived)
    if out_of_range:
        run.skip(f"{label}: {out_of_range}")
        return None
    return derived, shift_growth(pristine, derived) if derive.startswith("shifted") else 1.0


def _expected(run, refs: _Refs, label: str, inputs: list, s, derive, grow: float, saved):
    """The references' outputs (and, --backward, gradients) at this call: (grads, Expected). The reference raising
    on its own inputs is the reference's error; on a derived input the call is skipped (None), the reference's
    state put back."""
    try:
        with run.clock.timed("parity: the references' backward (fp32 and float64)"):
            grads = run.gradients.expected(refs, inputs, s, run.precision, label) if run.backward else None
        with run.clock.timed("parity: the references (fp32 and float64) on benchmark-shape calls"):
            return grads, refs.expected(inputs, run.precision, grow=grow)
    except torch.OutOfMemoryError:  # the GPU's memory, not the reference: the judge's one line for it
        raise
    except Exception as e:
        if raised_by_judge(e):  # the judge's own bug: never taken for the reference's, never a skip
            raise
        if not derive:
            raise ReferenceRaised(f"the reference itself raised on its own inputs ({label})", e) from None
        refs.restore_buffers(saved)
        run.skip(f"{label}: the reference raises there ({type(e).__name__}: {first_line(e)[:100]})")
        return None


def _explained(run, refs: _Refs, row: Row, e: Rejected, call: CheckedCall, init, passed_before: bool) -> Rejected:
    """A row's rejection at a call with its cause where the judge can tell it: inputs followed at their old
    addresses, the reference's state not followed, a weight cache not recomputed, the row's own initialisation or
    inference semantics at the first call, TF32's error in fp32; else the rejection as it is."""
    stale = (
        call.moved
        and passed_before
        and _follows_old_inputs(run, row, call.label, call.inputs, call.exp, call.widen, call.derive)
    )
    if stale:  # the cause first, the figures short: the record keeps them whole
        figs = failed_figures(e) or {}
        err = f"relL2 {figs['rel_l2']:.2e}" if "rel_l2" in figs else f"wrong ({e.kind.replace('_', ' ')})"
        told = Rejected(
            f"{call.label}: {STALE_INPUTS}: {err} at this call's, {stale}", kind="stale_inputs", check=call.label
        )
        told.__cause__ = e
        return told
    if refs.state_attrs and passed_before:
        return Rejected(
            f"{e}; it passed the call before: the reference carries state from call to call "
            f"({', '.join(refs.state_attrs)}) and the candidate's output does not follow it",
            figures=failed_figures(e),
            kind=e.kind,
        )
    if call.changed and passed_before and stale_cache_shaped(e):
        return Rejected(
            f"{e}; it passed before the weights changed ({call.upd}): a value derived from the weights is not "
            f"recomputed (stale weight cache)",
            figures=failed_figures(e),
            kind=e.kind,
        )
    first = not passed_before and not call.upd and not call.derive and e.kind in ("wrong_output", "non_finite")
    hint = first and row.names and own_init_hint(run, row, init, call.label, call.inputs, call.exp)
    hint = hint or (first and eval_semantics_hint(run, row, init, call.label, call.inputs))
    if hint:
        return Rejected(f"{e}; {hint}", figures=failed_figures(e), kind=e.kind)
    tf32 = run.precision == "fp32" and tf32_hint(refs, call.inputs, call.exp, e)
    if tf32:
        return Rejected(f"{e}; {tf32[0]}", figures=tf32[1], kind=e.kind)
    return e


def _reference_notes(refs: _Refs, at: str | None) -> list[str]:
    """What the verdict says of the reference after its calls: state it carries, a float64 copy moved, none made."""
    notes = []
    if refs.state_attrs:
        notes.append(
            f"the reference carries state from call to call ({', '.join(refs.state_attrs)}): every "
            f"checked call is judged against it advanced through the same calls"
        )
    if refs.moved:
        notes.append(f"the float64 reference {refs.moved}" + (f" at {at}" if at else ""))
    if refs.fp32_only():
        notes.append(
            f"no float64 reference ({refs.how}); judged against PyTorch's fp32 output with "
            f"relL2 budget {FP32_ONLY_BUDGET:g}"
        )
    return notes


def _follows_old_inputs(run, row: Row, label: str, pristine: list, exp: Expected, widen, derive) -> str | None:
    """A row wrong at a call whose inputs moved, after passing the call before: called once more with the same
    values written where the call before had its inputs. Right there, its output follows the old addresses:
    the reason says so and names both calls."""
    old = in_retired_buffers(run, pristine)
    if old is None:
        return None
    try:
        check_call(
            run,
            row,
            f"{label}, at the previous call's addresses",
            pristine,
            exp,
            widen if derive else None,
            buffers=old,
        )
    except Rejected:
        return None
    return "right with its values at the previous call's addresses"


def each_update(run, refs: _Refs, kind: str, seed: int) -> bool:
    """Change the weights alike on every side; False when the model has none to change."""
    live = [r for r in run.live() if r.names is not None]
    only = set.intersection(*[set(r.names) for r in live]) if live else None
    upd = make_update(kind, refs.r32, seed, only)
    if not upd:
        return False
    refs.update(upd)
    run._each(lambda row: row.runner.call(f"weights ({kind})", "update", row.label, rename_update(upd, row.names)))
    return True


def parity_cases(run) -> None:
    seeds = [run.seed] if run.device == "cuda" else trial_seeds(run.seed, MIN_TRIALS)
    for name in run.ref.cases:
        for s in seeds:
            if not run.live():
                return
            c_init, c_inputs = run.ref.case(name, s, run.device)
            with run.clock.timed("cases: the references built and run"):
                c_refs = _Refs(run.ref, c_init, s, run.device, run.device, run.train)
                label = f"case {name} (seed {s})"
                state0 = {k: v.clone() for k, v in c_refs.state().items()}  # before the reference's call
                before = c_refs.save_buffers()  # the same, as the honest-rounding runs start from it
                grads = run.gradients.expected(c_refs, c_inputs, s, run.precision, label) if run.backward else None
                exp = c_refs.expected(c_inputs, run.precision)
            # a case's inputs may sit far from the benchmark's (a row that cancels): widened as a derived input
            widen = output_widener(run, c_refs, c_inputs, exp, "a declared case", before)
            if grads is not None:
                grads.widen = run.gradients.widener(c_refs, c_inputs, grads, before)

            def one(row):
                with run.clock.timed("cases: the row's model built and loaded"):
                    build_row(run, row, c_refs, c_init, s, stage=label, state=state0)
                row.checks[label] = check_call(run, row, label, c_inputs, exp, widen, grads=grads)
                check_buffers(run, row, f"buffers after {label}", c_refs)
                row.runner.call(label, "drop", row.label)

            with run.clock.timed("cases: the rows built, called and checked"):
                run._each(one)
            del c_refs, c_inputs, exp
