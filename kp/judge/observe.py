"""The judge's optional observation stages: one call of each row under PyTorch's profiler (--profile) and under
Nsight Compute (--ncu)."""

from __future__ import annotations

from pathlib import Path

from kp.errors import Rejected
from kp.judge.release import release_cached


# The stages take the judge's run (kp.judge.driver.Judge): its rows and runners, its seed and log.
def stage_profile(run, rec: dict, init) -> None:
    rec["profile"] = _profile(run)


def stage_ncu(run, rec: dict, init) -> None:
    rec["ncu"] = _ncu(run, init, rec)


def _profile(run) -> dict:
    """One call of each baseline and live row under the profiler, in the process that holds it (a candidate's
    own worker); a failure here is logged, never a verdict."""
    out = {}
    for runner in run.runners:
        rows = [r for r in run.live() if r.runner is runner]
        if run.rows and not rows:
            continue
        try:
            out.update(runner.call("profile", "profile", [r.label for r in rows], (run.seed + 3000) % 2**32)["profile"])
        except Rejected as e:
            run.log(f"{run.ref.name}: no profile: {e}")
    return out


def _ncu(run, init, rec: dict) -> dict:
    """One call of each baseline and live row under Nsight Compute (kp.observe.ncu), in a process of its own started
    after the judge's rows are released; a boxed candidate is left out (kp.observe.ncu says why)."""
    from kp.observe import ncu
    from kp.observe.report import row_traffic

    rows, notes = [], []
    for r in run.live():
        if r.runner.isolated:
            if r.runner.sandboxed:
                notes.append(
                    f"{r.label} not profiled: it runs in the sandbox, which ncu cannot reach into "
                    f"(--no-sandbox includes it)"
                )
                continue
            rows.append({"label": r.label, "candidate": str(Path(r.path).resolve())})
        else:
            rows.append({"label": r.label, "variant": r.variant, "opts": r.opts})
    min_bytes = (
        {k: row_traffic(rec, k)["bytes"] for k in ["eager", "torch.compile"] + [r["label"] for r in rows]}
        if rec.get("traffic")
        else {}
    )
    spec = {
        "ref_spec": list(run.ref.spec),
        "precision": run.precision,
        "init": init,
        "seed": run.seed,
        "compile": run.compile_baseline,
        "rows": rows,
        "notes": notes,
    }
    run.log(f"{run.ref.name}: one call of each row under Nsight Compute")
    release_cached()
    return ncu.run(spec, min_bytes, rec.get("bandwidth"))
