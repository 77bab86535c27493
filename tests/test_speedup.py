"""A speedup's paired interval (kp.lib.speedup): its coverage on rows that are their baseline, its power on a row
twice as fast, what it refuses, and how the record, the table and a batch's table carry it."""

import random

import pytest

from kp.lib.speedup import MIN_ROUNDS, _order_k, paired_speedup, paired_speedups, said


def _rounds(n, ratio, rng, noise=0.03, drift=0.2):
    """n interleaved rounds: a shared per-round drift (clocks, neighbours) on both, independent noise on each."""
    base, row = [], []
    for _ in range(n):
        d = 1.0 + drift * rng.random()
        base.append(d * (1 + noise * rng.gauss(0, 1)))
        row.append(d / ratio * (1 + noise * rng.gauss(0, 1)))
    return base, row


def test_the_order_statistic_is_the_binomials():
    assert _order_k(5, 0.95) == 0 and _order_k(6, 0.95) == 1  # 2 x 0.5^6 = 0.031 <= 0.05
    assert _order_k(100, 0.95) == 40  # the textbook interval of a median of 100: the 40th to the 61st
    assert MIN_ROUNDS == 6


def test_a_row_that_is_its_baseline_is_not_significant_in_at_least_95_of_100_runs():
    rng = random.Random(7)
    ns = sum(not paired_speedup(*_rounds(rng.choice((10, 30, 100)), 1.0, rng))["significant"] for _ in range(1000))
    assert ns >= 950, ns  # the interval's level is 95%: measured coverage


def test_a_row_twice_as_fast_is_significant_and_its_interval_holds_two():
    rng = random.Random(3)
    for n in (10, 30, 100):
        s = paired_speedup(*_rounds(n, 2.0, rng))
        assert s["significant"] and s["lo"] <= 2.0 <= s["hi"] and 1.9 < s["x"] < 2.1, s
        assert said(s) == f"{s['x']:.2f}x [{s['lo']:.2f}-{s['hi']:.2f}]"


def test_unpaired_or_too_few_samples_give_no_interval():
    assert paired_speedup([1.0] * 5, [1.0] * 5) is None
    assert paired_speedup([1.0] * 8, [1.0] * 7) is None
    assert paired_speedup([1.0] * 8, [0.0] * 8) is None
    s = paired_speedup([1.0] * 8, [1.0] * 8)
    assert s["x"] == 1.0 and not s["significant"] and said(s) == "1.00x n.s."
    assert said(None) == "-"


def test_each_row_against_the_baselines_of_its_command():
    rng = random.Random(1)
    base, fast = _rounds(20, 3.0, rng)
    timing = {"eager": {"samples": base}, "torch.compile": {"samples": base[:10]}, "candidate": {"samples": fast}}
    got = paired_speedups(timing, ["candidate"])
    assert set(got["candidate"]) == {"eager"}, got  # the compiled baseline's samples are not paired with the row's
    assert got["candidate"]["eager"]["significant"]


def test_the_batch_table_says_not_significant():
    from kp.batch.jobfile import format_table, summary

    rec = {
        "rows": {"candidate": {"accepted": True}},
        "timing": {"eager": {"median_ms": 1.0}, "candidate": {"median_ms": 0.99}},
        "speedups": {
            "candidate": {
                "eager": {"x": 1.01, "lo": 0.97, "hi": 1.05, "rounds": 20, "level": 0.95, "significant": False}
            }
        },
    }
    s = summary({"record": rec})
    assert s["vs_eager"] == pytest.approx(1.0 / 0.99) and s["vs_eager_significant"] is False
    line = {"ok": True, "job": {"name": "cand.py"}, "summary": s, "verdict": "accepted", "elapsed_s": 3}
    assert "1.01x n.s." in format_table([line])
