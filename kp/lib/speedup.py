"""A speedup with its noise: the paired interval of a row's speedup over a baseline timed beside it.

The timing interleaves its callables (kp.lib.timing.bench_interleaved): round i times the baseline and the row one
after the other, so sample i of each met the same clocks, the same neighbours on the host and the same thermal
state. The speedup of round i is baseline_i / row_i; the figure is the median of those ratios, and its interval
the distribution-free confidence interval of a median (order statistics of the n ratios: the k-th smallest to the
k-th largest, k the largest for which a Binomial(n, 1/2) falls below k with probability at most (1 - level) / 2).
No assumption of normality or of independence between a baseline's and a row's noise: what moves both in one round
cancels in its ratio. The interval covering 1.0 is `not significant`: the samples cannot tell the row from the
baseline. docs/judge.md ('Speedups and their interval') gives its coverage measured on a row that is the baseline.
"""

from __future__ import annotations

import math

LEVEL = 0.95  # the interval's confidence
MIN_ROUNDS = 6  # fewer paired rounds than this give no 95% interval of a median (0.5^5 > 0.025)


def _order_k(n: int, level: float) -> int:
    """The largest k (1-based) with P(Binomial(n, 1/2) < k) <= (1 - level) / 2; 0 where none is (n too small)."""
    tail, k, cdf = (1 - level) / 2, 0, 0.0
    for j in range(n + 1):
        cdf += math.comb(n, j) / 2**n
        if cdf > tail:
            break
        k = j + 1
    return k


def paired_speedup(baseline: list[float], row: list[float], level: float = LEVEL) -> dict | None:
    """The median of the per-round ratios baseline_i / row_i and its `level` interval, as the record keeps them
    ({"x", "lo", "hi", "rounds", "significant"}); None where the samples are not paired (another count), too few
    (MIN_ROUNDS) or not all positive."""
    if len(baseline) != len(row) or len(row) < MIN_ROUNDS or min(baseline + row) <= 0:
        return None
    ratios = sorted(b / r for b, r in zip(baseline, row))
    n = len(ratios)
    mid = (ratios[(n - 1) // 2] + ratios[n // 2]) / 2
    k = _order_k(n, level)
    lo, hi = ratios[k - 1], ratios[n - k]
    return {"x": mid, "lo": lo, "hi": hi, "rounds": n, "level": level, "significant": not lo <= 1.0 <= hi}


def paired_speedups(timing: dict, rows: list[str]) -> dict:
    """Each row's paired speedup over each baseline timed in the same command (`timing`: label -> its reduced
    timing, with its samples): {row: {"eager": ..., "torch.compile": ...}}, a baseline absent or unpaired left out."""
    out = {}
    for label in rows:
        mine = (timing.get(label) or {}).get("samples") or []
        got = {
            base: paired_speedup(timing[base].get("samples") or [], mine)
            for base in ("eager", "torch.compile")
            if base in timing
        }
        got = {k: v for k, v in got.items() if v is not None}
        if got:
            out[label] = got
    return out


def said(s: dict | None) -> str:
    """A paired speedup as the table says it: '1.93x [1.90-1.96]', or '1.01x n.s.' where its interval covers 1.0."""
    if not s:
        return "-"
    return f"{s['x']:.2f}x [{s['lo']:.2f}-{s['hi']:.2f}]" if s["significant"] else f"{s['x']:.2f}x n.s."
