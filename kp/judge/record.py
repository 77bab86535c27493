"""The judge's record: its head (what was judged, how, with which seeds) written before the stages, its tail (each
row's verdict and evidence, the timings) after them, from the judge's run (kp.judge.driver.Judge)."""

from __future__ import annotations

import os
from pathlib import Path
import time

import torch

from kp.errors import ACCEPTED, REJECTED
from kp.judge.parity import parity_sequence

# The record's layout, as kp/record.schema.json describes it: raised when a key changes meaning or goes
SCHEMA_VERSION = 1
SCHEMA = Path(__file__).resolve().parents[1] / "record.schema.json"


def validate_record(rec: dict) -> None:
    """Raise jsonschema's ValidationError where the record (as JSON writes it) breaks kp/record.schema.json. The
    tests run every judgement with KP_VALIDATE_RECORDS=1, which calls this on each record made."""
    import json
    import jsonschema  # imported here: only a run that validates needs it

    jsonschema.validate(json.loads(json.dumps(rec, default=str)), json.loads(SCHEMA.read_text()))


def process_age_s() -> float | None:
    """Seconds since this process started (Linux: /proc), or None where that cannot be read."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(uptime - start_ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return None


def record_head(run, gpu: bool) -> dict:
    seeds = [s for _, s, _, _ in parity_sequence(run)]
    run.log(f"{run.ref.name}: every input of the run is drawn from --seed {run.seed} (give it again to replay them)")
    run.skipped = []
    rec = {
        "schema_version": SCHEMA_VERSION,
        "reference": run.ref.name,
        "ref_spec": list(run.ref.spec),
        "seed": run.seed,
        "mode": run.mode,
        "notes_list": run.notes,
        "timeout_s": run.timeout_s,
        "trial_seeds": seeds[: run.trials],
        "precision": run.precision,
        "allow_torch": run.allow_torch,
        "device": torch.cuda.get_device_name() if gpu else "cpu",
        "torch": torch.__version__,
        "footprint": run.fp,
        "shape": run.fp["shapes"],
        "rows": {},
        "skipped": run.skipped,
    }
    if run.box_note:
        rec["sandbox"] = run.box_note
    if run.at_sizes:  # --at: judged at this shape, not the benchmark's
        rec["at"] = {
            "asked": run.opts.at,
            "benchmark_shape": run.at_bench,
            "sizes": {k: list(v) for k, v in run.at_sizes.items()},
        }
    return rec


def record_tail(run, rec: dict, gpu: bool) -> dict:
    rec["elapsed_s"] = round(time.perf_counter() - run.t_start, 2)  # from the judge's start: footprint included
    if run.before_judge_s is not None:
        rec["process_s_before_judge"] = round(run.before_judge_s, 2)
    for row in run.rows:
        rec["rows"][row.label] = {
            "accepted": row.accepted,
            "reason": row.reason,
            "peer": row.peer,
            "checks": row.checks,
            # which kernels ran is seen on the GPU alone (the escape stage's profile): None where it was not
            "pure_torch": row.pure_torch if gpu else None,
            "library_kernels": row.library_kernels if gpu else None,
            "own_kernels": row.own_kernels,
            "kernels": row.kernels,
            "escape": row.escape,
            "path": row.path,
            "opts": row.opts,
            "weights": row.weights,
            "kernelbench": row.kernelbench,
            "traceback": row.traceback,
            "build_failures": getattr(row.runner, "build_failures", []),
            "failure": row.failure,
        }
    if run.refs is not None:
        rec["reference_precision"] = run.refs.how
        if run.refs.chunk_proof:
            rec["float64_reference"] += f"; run {run.refs.chunk_proof}" if not run.refs.moved else ""
    if run.ref.host_draw and run.ref.host_draw not in run.notes:
        run.notes.append(run.ref.host_draw)
    rec["inputs_drawn_on"] = "the host" if run.ref.host_draw or run.device == "cpu" else "the device"
    rec["ok"] = all(r.accepted or r.peer for r in run.rows)
    rec["status"] = ACCEPTED if rec["ok"] else REJECTED
    failed = [r for r in run.rows if not r.accepted and not r.peer]
    rec["failure"] = failed[0].failure if failed else None  # a candidate's, or the first rejected row's
    rec["stages_not_run"] = [] if gpu else ["timing", "escape", "own kernel"]
    if os.environ.get("KP_VALIDATE_RECORDS"):
        validate_record(rec)
    return rec
