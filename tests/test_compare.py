"""kp.judge.compare: the one comparison an output, a gradient and a buffer are held to, its budget model and its
widener, and the gradients' accumulation over a sequence of calls."""

import pytest
import torch

from kp.errors import Rejected
from kp.judge.backward import GradientCheck, Grads, GradientSequence
from kp.judge.clock import StageClock
from kp.judge.compare import ROUNDING_RUNS, Budget, compare, spread_over_roundings, widener
from kp.lib.numerics import Err, budget_from, rel_error


def _near(ref: torch.Tensor, by: float) -> torch.Tensor:
    return (ref * (1 + by)).float()


def test_the_budget_model_is_one_for_every_value():
    e = Err(1e-7, 3e-7, 0)
    for k, dtype, grow in ((1.0, torch.float32, 1.0), (4096.0, torch.float32, 2.0), (64.0, torch.bfloat16, 1.0)):
        assert Budget.of(e, k, dtype, grow).limit == budget_from(e, k, dtype, grow)
    assert Budget.fixed(1e-3).limit == Err(1e-3, 1e-3, 0)


def test_a_value_within_its_budget_never_asks_the_widener():
    ref = torch.randn(8, 32, dtype=torch.float64)
    asked = []
    c = compare(ref.float(), ref, Budget.of(rel_error(ref.float(), ref)), lambda: asked.append(1))
    assert c.ok and not c.widened and not asked


def test_over_its_budget_a_value_is_held_to_at_least_how_far_honest_roundings_move_the_reference():
    """The widened budget is the budget or the reference's spread under random roundings, whichever is larger: the
    spread is not multiplied (a value 2x past it is rejected, as at a derived input's output)."""
    ref = torch.randn(8, 32, dtype=torch.float64)
    budget = Budget.of(rel_error(ref.float(), ref))
    got = _near(ref, 1e-4)
    assert not compare(got, ref, budget).ok
    wide = compare(got, ref, budget, lambda: Err(2e-4, 2e-4, 0))
    assert wide.ok and wide.widened and wide.budget.limit == Err(2e-4, 2e-4, 0)
    assert wide.budget.torch_err == budget.torch_err
    assert not compare(got, ref, budget, lambda: Err(5e-5, 5e-5, 0)).ok
    assert not compare(got, ref, budget, lambda: None).widened  # no spread to be had: the budget as it was


def test_a_value_with_nan_where_the_reference_has_none_is_not_widened():
    ref = torch.randn(4, 16, dtype=torch.float64)
    got = ref.float()
    got[0, 0] = float("nan")
    asked = []
    c = compare(got, ref, Budget.of(Err(0.0, 0.0, 0)), lambda: asked.append(1) or Err(1.0, 1.0, 0))
    assert not c.ok and c.err.nonfinite_mismatch == 1 and not asked
    assert c.figures("x")["nonfinite_mismatch"] == 1 and c.figures("x")["check"] == "x"


class _Refs:
    """What the widener needs of the references: their state saved and put back around each run."""

    def __init__(self):
        self.state, self.restored = {"s": 0}, []

    def save_buffers(self):
        return dict(self.state)

    def restore_buffers(self, saved):
        self.restored.append(dict(saved))
        self.state = dict(saved)


def test_the_widener_runs_the_reference_again_from_the_state_before_the_call_and_keeps_the_worst():
    refs, want = _Refs(), {0: torch.ones(4, dtype=torch.float64), "g": torch.ones(2, dtype=torch.float64)}
    seen = []

    def again(noise):
        seen.append(refs.state["s"])
        refs.state["s"] = 99  # the run moves the references' state
        by = [1e-6, 4e-6, 2e-6][len(seen) - 1]
        return {0: want[0] * (1 + by), "g": torch.ones(3)}  # "g" of another shape: not measured

    moved = spread_over_roundings(refs, {"s": 7}, again, want)
    assert len(seen) == ROUNDING_RUNS and seen == [7, 7, 7] and refs.state == {"s": 0}
    assert set(moved) == {0} and moved[0].rel_l2 == pytest.approx(4e-6, rel=1e-6)
    assert spread_over_roundings(refs, None, lambda noise: None, want) is None


def test_the_widener_is_computed_once_and_gives_nothing_where_the_reference_cannot_run_again():
    clock, runs = StageClock(), []

    def again(noise):
        runs.append(1)
        return {0: torch.ones(2, dtype=torch.float64)}

    w = widener(clock.timed, "x", _Refs(), None, again, {0: torch.ones(2, dtype=torch.float64)})
    assert w() == w() and len(runs) == ROUNDING_RUNS

    def raises(noise):
        raise torch.OutOfMemoryError("no room")

    assert widener(clock.timed, "x", _Refs(), None, raises, {0: torch.ones(2, dtype=torch.float64)})() == {}


def _grads(g64: torch.Tensor, widen=None) -> Grads:
    return Grads(upstream=[], seed=9, inputs={0: (g64.float(), g64, 1.0)}, params={}, widen=widen)


class _Row:
    label, names = "candidate", {}


def test_a_gradient_is_compared_as_an_output_is_and_widened_the_same_way():
    """GradientCheck holds a gradient to the same budget and the same widened budget as an output: over the spread
    of the float64 gradient under random roundings it is rejected, within it accepted and said in the notes."""
    g64 = torch.randn(8, 32, dtype=torch.float64)
    got = {"inputs": [_near(g64, 1e-4)], "params": {}}
    notes = []
    check = GradientCheck(notes, lambda msg: None, "ref", StageClock())
    with pytest.raises(Rejected, match="the gradient of input 0: relL2") as e:
        check.check(_Row, "trial 1", got, _grads(g64))
    assert e.value.kind == "gradient" and e.value.figures["rel_l2"] == pytest.approx(1e-4, rel=1e-3)
    assert check.check(_Row, "trial 1", got, _grads(g64, lambda: {("input", 0): Err(2e-4, 2e-4, 0)}))
    assert len(notes) == 1 and "within how far honest fp32 roundings move" in notes[0]
    with pytest.raises(Rejected, match="row budget 5.00e-05"):
        check.check(_Row, "trial 1", got, _grads(g64, lambda: {("input", 0): Err(5e-5, 5e-5, 0)}))


def test_the_second_call_of_a_sequence_accumulates_the_parameters_gradients_and_no_other():
    def call(v: float) -> Grads:
        w = torch.full((2,), v)
        return Grads(upstream=[], seed=1, inputs={}, params={"w": (w, w.double(), 4.0)})

    seq = GradientSequence()
    first, second, third = seq.at(0, call(1.0)), seq.at(1, call(2.0)), seq.at(2, call(5.0))
    assert first.zero and third.zero and not second.zero
    assert torch.equal(second.params["w"][0], torch.full((2,), 3.0))
    assert torch.equal(third.params["w"][0], torch.full((2,), 5.0))
    assert GradientSequence().at(1, None) is None
