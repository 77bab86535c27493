"""KernelBench's own correctness check, run beside the judge's and reported next to the verdict, never deciding it:
what a candidate would get from KernelBench itself (a kernel the judge rejects and KernelBench passes is a gap that
check leaves open)."""

from __future__ import annotations

import time

import torch

from kp.errors import Rejected, first_line
from kp.judge.construct import cuda_builds_on_cpu
from kp.judge.outputs import _allclose
from kp.judge.release import release_cached
from kp.judge.reference import _as_list, trial_seeds
from kp.lib.numerics import HALF, clone_layout

KERNELBENCH_TRIALS = 5  # KernelBench's own correctness check: same-seed models, 5 draws, torch.allclose
KERNELBENCH_TOLS = ("1e-4", "1e-2")  # atol = rtol for fp32 now, and in the v0/v0.1 era of its leaderboard
KERNELBENCH_HALF_TOLS = ("1e-2",)  # its tolerance for fp16 and bf16 (get_tolerance_for_precision)


def kernelbench_tols(precision: str) -> tuple[str, ...]:
    return KERNELBENCH_HALF_TOLS if precision in HALF else KERNELBENCH_TOLS


def _not_run(out: dict, tols, why: str) -> dict:
    """The check stopped part-way: each tolerance not yet failed is 'not run (why)'; those already failed keep it."""
    return {t: f"not run ({why})" for t in tols if out.get(t, "pass") == "pass"} | {
        k: v for k, v in out.items() if v != "pass"
    }


# KernelBench's own correctness check, reported beside the verdict, never deciding it. The stage takes the
# judge's run (kp.judge.driver.Judge).
def stage_kernelbench(run, rec: dict, init) -> None:
    _kernelbench(run, init, runs=run.bench_parity)
    if not run.rows:  # the reference alone, timed: nothing of its own is checked here
        run.log(
            f"{run.ref.name}: no parity to check (the reference alone is timed against torch.compile; "
            f"--no-bench checks its own Model against float64 instead)"
        )
        return
    cuda_builds_on_cpu(run)  # no verdict said now, not after a line that calls the rows rejected
    live = [r for r in run.rows if r.accepted]
    checked = min((len(r.checks) for r in live), default=0)
    called = any(r.checks for r in run.rows)
    run.log(
        f"{run.ref.name}: parity done in {time.perf_counter() - run.t_parity:.0f} s: "
        + (
            f"{len(live)} of {len(run.rows)} rows pass, at least {checked} checked calls each"
            if checked
            else f"{len(live)} of {len(run.rows)} rows not rejected, no call checked here"
            if live
            else "every row rejected"
            if called
            else "every row rejected before its first checked call"
        )
    )


def _kernelbench(run, init, runs: bool = True) -> None:
    """KernelBench's own correctness check on each candidate, beside ours (it never decides the verdict):
    Model and ModelNew built after the same seed, nothing loaded or changed, KERNELBENCH_TRIALS draws of
    get_inputs(), torch.allclose at each of its tolerances for the precision (atol = rtol) on every output.
    Training mode, as KernelBench builds its models. runs=False: the benchmark shape is not run here (over the
    CPU limit), and the check is said not to have run."""
    tols = kernelbench_tols(run.precision)
    for row in run.rows:
        if not row.runner.isolated:
            continue
        if not runs:
            row.kernelbench = {t: "not run (the benchmark shape is over the CPU limit)" for t in tols}
            continue
        out = {}
        try:
            seed = (run.seed + 4000) % 2**32
            model = run.ref.model(init, seed, run.device)
            row.runner.call("kernelbench check", "build", "kernelbench", init, seed, "candidate", True)
            for s in trial_seeds(seed, KERNELBENCH_TRIALS):
                x = run.ref.inputs(s, run.device)
                with torch.no_grad():
                    want = _as_list(model(*[clone_layout(t) for t in x]))
                got = row.runner.call("kernelbench check", "forward", "kernelbench", x, 0)["out"]
                got = list(got) if isinstance(got, tuple) else [got]
                for tol, said in zip(tols, _allclose(got, want, [float(t) for t in tols])):
                    if out.get(tol, "pass") == "pass":
                        out[tol] = said
                del x, want, got
            row.runner.call("kernelbench check", "drop", "kernelbench")
            row.runner.call("kernelbench check", "release_inputs")
        except Rejected as e:
            out = _not_run(out, tols, str(e))
            if e.kind == "timeout":  # the job's time ran out here: that is the verdict
                row.reject(e)
        except torch.OutOfMemoryError as e:  # this check never decides a verdict, so it never voids one either
            out = _not_run(out, tols, f"the judge's process ran out of GPU memory: {first_line(e)[:120]}")
        row.kernelbench = {k: out[k] for k in sorted(out, key=float)}
        release_cached()
