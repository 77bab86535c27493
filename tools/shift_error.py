"""How an honest fp32 kernel's error grows when its inputs are shifted, against a numerically poor one: the evidence
for how the judge's derived input `shifted` and its budget should be set (kp.judge.parity.DERIVED, the floor
2 u sqrt(K) of kp.lib.numerics.accumulation_floor).

    python -m tools.shift_error [--rows 64] [--k 65536] [--shifts 0,-3,-10,-30]

Emulated in NumPy on the CPU, each against the float64 result, per row of K values drawn N(shift, 1):
- instance norm, two passes (the mean, then the squared deviations), each a plain sequential fp32 sum: an honest
  kernel (KernelBench leaderboard l1_p34 72f4f9c3 does this);
- instance norm, one pass (E[x^2] - mean^2), the same sums: cancellation (l1_p34 1dde64c9);
- Mish's softplus as log(1 + exp(x)) and as log1p(exp(x)), elementwise (the five leaderboard Mish candidates
  that write the former).
Prints each one's worst row's relative L2 error, the floor 2 u sqrt(K), and the inputs' RMS over its unshifted
value: a sequential sum's rounding is relative to the magnitudes it adds, so a shift that normalisation removes
multiplies the honest kernel's output error by about that ratio, and the one-pass kernel's by its square. Not a
test: nothing is asserted.
"""

from __future__ import annotations

import argparse

import numpy as np

U = 2.0**-24


def _seq_sum(a):
    return np.add.accumulate(a, axis=1, dtype=np.float32)[:, -1]


def norm_two_pass(x):
    k = np.float32(x.shape[1])
    m = _seq_sum(x) / k
    d = x - m[:, None]
    return d / np.sqrt(_seq_sum(d * d) / k + np.float32(1e-5))[:, None]


def norm_one_pass(x):
    k = np.float32(x.shape[1])
    m, q = _seq_sum(x) / k, _seq_sum(x * x) / k
    return (x - m[:, None]) / np.sqrt(q - m * m + np.float32(1e-5))[:, None]


def norm_f64(x):
    x = x.astype(np.float64)
    return (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5)


def worst_row(y, ref) -> float:
    return float((np.linalg.norm(y - ref, axis=1) / np.linalg.norm(ref, axis=1)).max())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--k", type=int, default=65536)
    ap.add_argument("--shifts", default="0,-3,-10,-30")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    rng = np.random.default_rng(a.seed)
    floor = 2 * U * a.k**0.5
    print(
        "| shift | inputs' RMS ratio | norm, two passes | norm, one pass | floor 2u sqrt(K) | "
        "softplus log(1+exp) | softplus log1p(exp) |\n|---|---|---|---|---|---|---|"
    )
    for s in (float(v) for v in a.shifts.split(",")):
        x = (rng.standard_normal((a.rows, a.k)) + s).astype(np.float32)
        ref = norm_f64(x)
        sp64 = np.log1p(np.exp(x.astype(np.float64)))
        with np.errstate(over="ignore"):
            naive, good = np.log(np.float32(1) + np.exp(x)), np.log1p(np.exp(x))
        print(
            f"| {s:g} | {np.sqrt(1 + s * s):.2f} | {worst_row(norm_two_pass(x), ref):.2e} | "
            f"{worst_row(norm_one_pass(x), ref):.2e} | {floor:.2e} | {worst_row(naive, sp64):.2e} | "
            f"{worst_row(good, sp64):.2e} |"
        )


if __name__ == "__main__":
    main()
