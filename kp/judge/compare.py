"""One comparison for everything the judge holds to the float64 reference: a call's outputs (kp.judge.outputs), its
gradients (kp.judge.backward) and the state it leaves behind (kp.judge.calls' buffers).

Each is relL2, overall and for the worst row, against the float64 value, within one budget model: REF_MULTIPLE times
PyTorch's own error on the same values, and at least the floor for the reduction behind each element
(kp.lib.numerics.budget_from). Where a value is over that budget, its NaN/Inf where the reference has them, and a
widener is given (at a derived input or a declared case, whose values may sit far from the benchmark's), the budget
is at least how far honest fp32 roundings move the float64 value there: the most it moves over ROUNDING_RUNS runs of
the float64 reference with every operator's result rounded at random by its own floor (kp.lib.op_modes.RoundingNoise).
One widener serves the outputs and the gradients: `widener`, over what the reference computes again."""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import torch

from kp.errors import raised_by_judge
from kp.judge.release import release_cached
from kp.lib.numerics import Err, budget_from, rel_error
from kp.lib.op_modes import RoundingNoise

ROUNDING_RUNS = 3  # runs of the float64 reference under random roundings: the widened budget is the most they move


def _at_least(a: Err, b: Err) -> Err:
    return Err(max(a.rel_l2, b.rel_l2), max(a.worst_row, b.worst_row), 0)


@dataclasses.dataclass(frozen=True)
class Budget:
    """What a value is held to: PyTorch's own error on the same values (torch_err) and the budget made from it
    (limit), overall and for the worst row."""

    torch_err: Err
    limit: Err

    @classmethod
    def of(cls, torch_err: Err, k: float = 1.0, dtype: torch.dtype = torch.float32, grow: float = 1.0) -> "Budget":
        """The budget model: REF_MULTIPLE x PyTorch's error, at least the floor of a reduction of length k in the
        dtype PyTorch returns (times `grow`: kp.judge.outputs.few_scale, kp.judge.parity's shift growth)."""
        return cls(torch_err, budget_from(torch_err, k, dtype, grow))

    @classmethod
    def fixed(cls, limit: float) -> "Budget":
        """A budget given outright (no float64 reference: kp.judge.float64.FP32_ONLY_BUDGET)."""
        return cls(Err(0.0, 0.0, 0), Err(limit, limit, 0))

    def at_least(self, moved: Err | None) -> "Budget":
        """The same, at least how far honest fp32 roundings move the float64 value (None: as it is)."""
        return self if moved is None else dataclasses.replace(self, limit=_at_least(self.limit, moved))


@dataclasses.dataclass(frozen=True)
class Compared:
    """One value against its float64 reference: its error, the budget it was held to, and whether that budget was
    widened to how far honest roundings move the reference (the notes say so where it passes)."""

    err: Err
    budget: Budget
    widened: bool = False

    @property
    def ok(self) -> bool:
        return self.err.within(self.budget.limit)

    def figures(self, check: str) -> dict:
        """A failed comparison's numbers, as the record keeps them (rows.<label>.checks[check])."""
        return error_figures(check, self.err, self.budget.limit, self.budget.torch_err)


def compare(got: torch.Tensor, want: torch.Tensor, budget: Budget, widen: Callable[[], Err | None] | None = None):
    """`got` against the float64 value `want` (on the host or on got's device) within `budget`; where it is over,
    its NaN/Inf where the reference has them, and `widen` is given: held to the budget at least how far honest
    roundings move `want` (widen() gives that, or None where it cannot be had)."""
    e = rel_error(got, want)
    if e.within(budget.limit) or widen is None or e.nonfinite_mismatch:
        return Compared(e, budget)
    moved = widen()
    return Compared(e, budget.at_least(moved), moved is not None)


def error_figures(check: str, e: Err, budget: Err, e_ref: Err | None = None) -> dict:
    """A failed comparison's numbers, as the record keeps them (rows.<label>.checks[check])."""
    out = {
        "check": check,
        "rel_l2": e.rel_l2,
        "worst_row": e.worst_row,
        "budget": budget.rel_l2,
        "row_budget": budget.worst_row,
        "nonfinite_mismatch": e.nonfinite_mismatch,
    }
    return {**out, "torch_rel_l2": e_ref.rel_l2} if e_ref is not None else out


def spread_over_roundings(refs, state: dict | None, again: Callable, want: dict) -> dict | None:
    """For each float64 value `want` holds (by key: an output's index, a gradient's name), the most it moves over
    ROUNDING_RUNS runs of `again` (the float64 reference's call once more, under the RoundingNoise it is given; it
    returns its values by the same keys, or None where it cannot run), as an Err against it. Each run starts from
    `state` (the references' state before the call, save_buffers) where given; the references' state is put back
    after each run. None where a run gives nothing."""
    worst: dict = {}
    for seed in range(ROUNDING_RUNS):
        saved = refs.save_buffers()
        try:
            if state is not None:
                refs.restore_buffers(state)
            got = again(RoundingNoise(seed))
        finally:
            refs.restore_buffers(saved)
        if got is None:
            return None
        for key, w in want.items():
            g = got.get(key)
            if isinstance(g, torch.Tensor) and g.shape == w.shape:
                e = rel_error(g.to(w.device), w)
                worst[key] = _at_least(worst.get(key, Err(0.0, 0.0, 0)), e)
    return worst


def widener(timed, what: str, refs, state: dict | None, again: Callable, want: dict) -> Callable[[], dict]:
    """The widener of one call's values: a function giving, once computed (for every row that asks), how far honest
    roundings move each of them (spread_over_roundings, by key); {} where the runs cannot be made (no room for
    them, or the reference under the rounding mode raised): the budgets stay as they were, and so do the verdicts.
    timed: the judge's stage timer, under `what`. It holds `want`'s values, never the expectation that holds it: a
    cycle would keep each call's values alive until Python's next full garbage collection (30 GiB at the softmax's
    benchmark shape)."""

    @functools.cache
    def widen() -> dict:
        try:
            with timed(f"parity: how far honest roundings move {what}"):
                return spread_over_roundings(refs, state, again, want) or {}
        except Exception as e:
            if raised_by_judge(e):
                raise
            release_cached()
            return {}

    return widen
