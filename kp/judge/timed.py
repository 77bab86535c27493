"""The judge's timing stage: every row interleaved with eager and torch.compile in the rows' own processes, the
samples told call by call and reduced here, timed calls checked where this process decides (the ceilings are
measured in the same run: kp.judge.ceilings). Running out of GPU memory while timing is no verdict: the rows passed
parity at the same shapes, and what timing adds is the judge's (a pool of fresh inputs, the baselines' outputs
beside the rows'). It is never an acceptance either; a row that takes more memory with every call is not told apart
from that here."""

from __future__ import annotations

import copy
import dataclasses
import time

import torch

from kp.errors import GpuMemoryShort, OutOfMemory, Rejected
from kp.judge.outputs import judge_output
from kp.judge.release import release_cached
from kp.lib.numerics import same_values
from kp.lib.gpu_lock import gpu_to_itself
from kp.lib.speedup import paired_speedups
from kp.judge.construct import build_row, fresh_refs
from kp.judge.family_parity import scale_workers, wrong_at
from kp.judge.parity import each_update

# Timed calls checked per row: one at a secret rep below the least reps, and at random at most this many more (each
# check of a large problem computes a float64 reference: two in all is what the judge paid before the draw moved here)
MAX_TIMED_CHECKS = 1
EXTRA_CHECK_P = 0.05


def reduce_samples(timing: dict, wall_ms: float) -> dict:
    """A worker's timing reply, reduced in the judge's process: median and quartiles from each entry's samples (the
    worker's own summary is not used), host_us as reported. Raises Rejected when the samples add up to more than
    `wall_ms`, the time the whole command took as seen from here: each sample is GPU time between two events inside
    it, one timed call after another."""
    from kp.lib.timing import summarize

    total = sum(sum(v.get("samples") or []) for v in timing.values())
    if total > wall_ms:
        raise Rejected(
            f"timing: the reported samples add up to {total:.1f} ms, more than the {wall_ms:.1f} ms the "
            f"timing command took: they were not measured",
            kind="timing",
        )
    out = {}
    for k, v in timing.items():
        if not v.get("samples"):
            raise Rejected(f"timing: no samples reported for {k}", kind="timing")
        t = dataclasses.asdict(summarize([float(x) for x in v["samples"]]))
        t["host_us"] = v.get("host_us", float("nan"))
        out[k] = t
    return out


def check_told(timing: dict, told: dict) -> None:
    """Raises Rejected unless each entry's samples in a worker's timing reply are those it told the judge one by one,
    right after each call (kept in the judge's process, out of the models' reach): otherwise they were changed in the
    worker after they were taken, or a call went untold."""
    for k, v in timing.items():
        mine = told.get(k, [])
        if [float(x) for x in v.get("samples") or []] != mine:
            raise Rejected(
                f"timing: the {len(v.get('samples') or [])} samples of {k} returned at the end differ from "
                f"the {len(mine)} told to the judge after each call: changed in the worker's process",
                kind="timing",
            )


def stage_escape(run, rec: dict, init) -> None:
    """Escape and own kernel (kp.judge.escape). With timing, the first of the stages with the GPU to this judge
    alone (no other judge's kernels, until the driver's stages end): the profiled busy time a median is held
    against is taken here. Without timing it shares the GPU (kp.lib.gpu_lock)."""
    run.t_gpu_stages = time.perf_counter()
    _rebuild(run, init)
    if run.bench:
        run.held.enter_context(gpu_to_itself(run.log))
        run.gpu_own = True
    run._each(run.escape_check.check)


def stage_timing(run, rec: dict, init) -> None:
    if run.refs is not None and run.refs.state_attrs:  # a reference whose calls carry state: it and the rows
        # start again from the seed with the current weights, and each row's calls are followed (_advanced)
        run.refs = fresh_refs(run, init)
        _rebuild(run, init)
    moved = run.refs.moved
    timed = time_rows(run)
    if run.refs.moved and run.refs.moved != moved:  # a checked timed call's forward did not fit beside
        note = f"the float64 reference {run.refs.moved} during timing"  # the worker's pool: host from then
        run.notes.append(note)
        rec["float64_reference"] = f"{run.f64_where}; {note}"
    rec.update(timed)
    if run.backward and rec.get("timing"):
        rec["timing_backward"] = _timing_backward(run)
    if run.bench and rec.get("family"):
        _time_family(run, rec, init)
    run.log(f"{run.ref.name}: escape checks and timing done in {time.perf_counter() - run.t_gpu_stages:.0f} s")


def _time_family(run, rec: dict, init) -> None:
    """--shapes with timing: the rows and baselines timed again, side by side as at the benchmark's shape, at
    every member of the family parity passed at (kp.judge.family): the speed curve, in each member's entry of
    rec["family"] ("timing", "traffic"). A timed call checked wrong there rejects the row naming both shapes,
    as parity does; a member whose timing does not fit in the GPU's memory is skipped and said."""
    g, bench, bench_fp = vars(run.ref.module), run.fp["shapes"], run._fp
    timed_any = False
    for entry in rec["family"]:
        if entry.get("skipped") or not entry.get("passed") or not run.live():
            continue
        sizes = {k: (g[k], v) for k, v in entry["sizes"].items()}
        g.update(entry["sizes"])
        timed_any = True
        try:
            run._fp = run.ref.footprint(run.device, run.train)
            scale_workers(run, sizes)  # each worker draws its timing's inputs: at the member's sizes
            if run.refs is not None:  # the timed calls' checks: a member's few outputs as parity judged them
                run.refs.bench_rms = run.bench_rms
            _rebuild(run, init)
            live = {r.label for r in run.live()}
            try:
                timed = time_rows(run)
            except GpuMemoryShort as e:
                entry["timing_skipped"] = str(e)
                run.skip(f"timing at {entry['shape']} ({entry['member']} sizes): the GPU's memory ran short")
                continue
            wrong_at(run, live, bench, entry["shape"], entry["member"], rec["family"])
            entry["timing"] = timed.get("timing", {})
            entry["rungs"] = timed.get("rungs", {})  # what a dispatching row ran there
            entry["traffic"] = traffic(run, init)
        finally:
            g.update({k: old for k, (old, _) in sizes.items()})
            scale_workers(run, {k: (new, old) for k, (old, new) in sizes.items()})
            run._fp = bench_fp
            if run.refs is not None:
                run.refs.bench_rms = None
            release_cached()
    if timed_any:
        _rebuild(run, init)


def interim(run, msg: dict):
    """A timed call, reported by a worker outside the timed region, before any other code of the models has run.
    First its sample (`ms`, kept here: the median is taken from these) and, for a judged row (`ask`), its seed:
    the answer, decided here, is whether the judge checks it (each row's call at a secret rep below the least
    number of reps, and others at random). Then a checked call's output and inputs: checked here against the
    reference for that seed, computed now."""
    if "ms" in msg:
        run.timed_samples.setdefault(msg["label"], []).append(float(msg["ms"]))
    row = next((r for r in run.rows if r.label == msg["label"] and r.accepted), None)
    log = run.call_log.get(msg["label"]) if run.call_log is not None else None
    if log is not None and "seed" in msg and "out" not in msg:
        log.append(int(msg["seed"]))  # a stateful reference: every call of the row, in order
    if row is None or msg.get("advance") or ("ms" in msg and not msg.get("ask")):
        return False
    if msg.get("ask"):
        n = run.timed_checks.setdefault(row.label, 0)
        want = msg["rep"] == run.check_at.setdefault(row.label, run.rng.randrange(run.reps[0])) or (
            n < MAX_TIMED_CHECKS and run.rng.random() < EXTRA_CHECK_P
        )
        run.timed_checks[row.label] = n + want
        return want
    seed = msg["seed"]
    label = f"timed call (rep {msg['rep']}, inputs seed {seed})"
    try:
        pristine = run.ref.inputs(seed, run.device)
        for i, (a, b) in enumerate(zip(msg["inputs"], pristine)):
            if isinstance(b, torch.Tensor) and not same_values(a, b):
                raise Rejected(
                    f"{label}: input {i} was modified (or is not the draw of the seed it reported)",
                    kind="input_modified",
                )
        with run.clock.timed("timing: the checked timed calls' references"):
            exp = _advanced(run, row.label, seed).expected(pristine, run.precision)
        row.checks[label] = judge_output(label, msg["out"], msg["type"], exp)
    except Rejected as e:
        row.reject(e)
    del msg
    release_cached()
    return True


def _advanced(run, label: str, seed: int):
    """The references a row's checked timed call is judged against: the judge's own where calls carry no state;
    for a stateful reference the row's copy, advanced through every call the row made before this one."""
    if run.call_log is None:
        return run.refs
    refs, log = run.row_refs[label], run.call_log[label]
    if not log or log[-1] != seed:
        raise Rejected(
            f"timing: the calls the worker reported do not end with the checked call's seed {seed}", kind="timing"
        )
    for s in log[:-1]:
        refs.advance(run.ref.inputs(s, run.device), run.precision)
    log.clear()
    return refs


def _rebuild(run, init) -> None:
    """The declared cases built models of their own shapes: back to the benchmark's, with the current weights."""
    run._each(lambda row: build_row(run, row, run.refs, init, run.seed, stage="escape"))


def time_rows(run) -> dict:
    """Every runner's rows and baselines timed side by side (the worker's time command). Its samples are reduced
    here, and must fit in the wall time this process saw the command take: samples that add up to more were not
    measured (a forged reply, or samples rewritten in the worker)."""
    refs = run.refs
    each_update(run, refs, "in-place edit", (run.seed + 999) % 2**32)
    run.check_at, run.timed_checks = {}, {}
    stateful = bool(refs is not None and refs.state_attrs)
    run.call_log = {r.label: [] for r in run.live()} if stateful else None
    run.row_refs = {r.label: copy.deepcopy(refs) for r in run.live()} if stateful else None
    release_cached()
    result = {}
    timed = [(runner, [r for r in run.live() if r.runner is runner]) for runner in run.runners]
    timed = [(runner, rows) for runner, rows in timed if rows or not run.rows]  # no rows: baselines alone
    for runner, rows in timed:
        try:
            t, times = _time_command(run, runner, rows, stateful)
        except Rejected as e:
            if isinstance(e, OutOfMemory):  # the harness's memory, not the row's (module doc)
                why = str(e)
                held = why.find(" [the raising process:")  # the worker's own figures: kept past the cut
                held = why[held : why.index("]", held) + 1] if held > 200 else ""
                why = why[:200] + ("..." if len(why) > 200 else "") + held
                raise GpuMemoryShort(
                    f"{run.ref.name}: the GPU ran out of memory while timing, after parity "
                    f"passed at the same shapes: the timing's input pool and baselines beside "
                    f"the rows did not fit on this GPU, so there is no verdict; judge again with "
                    f"the GPU to itself or on one with more memory ({why})"
                ) from None
            for r in rows:
                r.reject(e)
            continue
        result.setdefault("timing", {}).update(times)
        # each row against the baselines of its own command, round by round (kp.lib.speedup)
        result.setdefault("speedups", {}).update(paired_speedups(times, [r.label for r in rows]))
        result.setdefault("rungs", {}).update(t["rungs"])
        result.setdefault("calls", {}).update(t["calls"])
        if "memory" in t:  # the timing's own GPU memory in that process: its pool, outputs and baselines
            result.setdefault("timing_memory", []).append({"rows": [r.label for r in rows], **t["memory"]})
        for r in rows:
            if r.accepted and not run.timed_checks.get(r.label):
                r.reject(Rejected("timing: no timed call of this row was offered for a check", kind="timing"))
    return result


def _time_command(run, runner, rows: list, stateful: bool, backward: bool = False) -> tuple[dict, dict]:
    """One runner's timing command (the worker's time command): (its reply, its samples reduced here), the samples
    checked against those told call by call and against the wall time this process saw the command take."""
    t0 = time.perf_counter()
    run.timed_samples = {}
    with run.clock.timed(
        "timing: forward and backward, interleaved"
        if backward
        else "timing: the interleaved timing command (its checked calls included)"
    ):
        t = runner.call("timing", "time", [r.label for r in rows], 2, *run.reps, stateful, backward)
    check_told(t["timing"], run.timed_samples)
    return t, reduce_samples(t["timing"], (time.perf_counter() - t0) * 1e3)


def _timing_backward(run) -> dict:
    """--backward: each runner's rows and baselines timed again as training steps, forward and backward
    (the worker's time command with backward), interleaved and flushed as the forward was; the samples told and
    reduced as there. Nothing is checked here (parity judged each call's gradients). Running out of GPU memory here
    is said and skipped (the training step holds the graph and the gradients beside the timing's pool): the
    forward's verdict stands."""
    result = {}
    for runner in run.runners:
        rows = [r for r in run.live() if r.runner is runner]
        if not rows and run.rows:
            continue
        try:
            result.update(_time_command(run, runner, rows, False, backward=True)[1])
        except OutOfMemory as e:
            run.skip(f"forward+backward timing: the GPU ran out of memory ({str(e)[:160]})")
            return {}
        except Rejected as e:
            for r in rows:
                r.reject(e)
    return result


def traffic(run, init) -> dict:
    """The fewest bytes and FLOPs of one call at the shape the sizes have now: each row's (its own declared
    traffic, or the reference's) and the baselines'."""
    x = run.ref.inputs(run.seed, run.device)
    out = {r.label: run.ref.traffic(x, init, run.fp, r.opts) for r in run.rows}
    out["eager"] = out["torch.compile"] = run.ref.traffic(x, init, run.fp)
    return out
