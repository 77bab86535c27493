"""The report: one table for the playground's variants and for candidates (the verdict line: kp.observe.verdict)."""

from __future__ import annotations

from kp.lib import speedup
from kp.observe.ncu import format_ncu
from kp.observe.profile import format_profile, kernel_base_name
from kp.observe.verdict import own_frames

# ---------------------------------------------------------------------------------------------------------------
# The report: one table for the playground's variants and for candidates.


def backward_lines(rec: dict, w: int = 16) -> list[str]:
    """--backward's timing under the forward's table: a row per baseline and judged row, each call a training step
    (the forward, then its backward pass from an upstream gradient drawn with the inputs), timed side by side."""
    tb = rec.get("timing_backward") or {}
    names = [k for k in row_names(rec) if k in tb]
    if not names:
        return []
    lines = [f"{'forward+backward':{w}} {'median ms':>9} {'IQR ms':>7} {'vs eager':>8} {'vs comp':>7}"]
    for k in names:
        t = tb[k]
        ve = tb["eager"]["median_ms"] / t["median_ms"] if "eager" in tb else float("nan")
        vc = f"{tb['torch.compile']['median_ms'] / t['median_ms']:.2f}x" if "torch.compile" in tb else "-"
        lines.append(f"{row_label(rec, k):{w}} {t['median_ms']:9.3f} {t['q3_ms'] - t['q1_ms']:7.3f} {ve:7.2f}x {vc:>7}")
    return lines


def row_names(rec: dict) -> list[str]:
    """The table's rows in order: the baselines, then the judged rows."""
    timing = rec.get("timing", {})
    return list(dict.fromkeys([k for k in ("eager", "torch.compile") if k in timing] + list(rec["rows"])))


def ran_label(label: str, rungs: dict) -> str:
    """A row's name with the rung it ran (`rungs`: label -> rung) where it picks one per call (auto->6_regcluster)."""
    rung = rungs.get(label, label)
    return f"{label}->{rung}" if rung != label else label


def row_label(rec: dict, label: str) -> str:
    """A row's name in the table: with the rung it ran at the benchmark's shape where it picks one per call."""
    return ran_label(label, rec.get("rungs") or {})


def row_traffic(rec: dict, label: str) -> dict:
    """The bytes and flops a row's call must move and do at least (a row without its own declared traffic has the
    reference's)."""
    return rec["traffic"].get(label, rec["traffic"]["eager"])


def row_floor_s(rec: dict, label: str) -> float:
    """The fastest a row's call could be at the ceilings measured in the run: its bytes at the copy rate or its
    flops at the best GEMM rate, whichever takes longer (the table's %roof is this over the median)."""
    return floor_s(row_traffic(rec, label), rec)


def floor_s(traffic: dict, rec: dict) -> float:
    """The fewest seconds a call of this traffic takes at the record's ceilings (copy bandwidth, best GEMM rate)."""
    return max(
        traffic["bytes"] / rec["bandwidth"], traffic["flops"] / rec["flops_rate"] if rec.get("flops_rate") else 0.0
    )


def curve(rec: dict) -> list[dict]:
    """The speed curve of a record timed with --shapes: one point per shape timed (the benchmark's first, then the
    family's members in order): shape, member, each timed label's median ms, and, per judged row, its speedup over
    eager and torch.compile and its share of the copy/GEMM ceiling measured in the run (None where not measured)."""
    out = []
    members = [
        {
            "shape": rec.get("shape"),
            "member": "benchmark",
            "timing": rec.get("timing") or {},
            "traffic": rec.get("traffic") or {},
            "rungs": rec.get("rungs") or {},
        }
    ] + [e for e in rec.get("family") or [] if e.get("timing")]
    if len(members) < 2 or not members[0]["timing"]:
        return []
    for e in members:
        t = {k: v["median_ms"] for k, v in e["timing"].items()}
        point = {
            "shape": e["shape"],
            "member": e["member"],
            "ms": t,
            "vs_eager": {},
            "vs_compile": {},
            "roof": {},
            "rungs": e.get("rungs") or {},
        }
        for k in rec["rows"]:
            if k not in t or k == "eager":
                continue
            point["vs_eager"][k] = t["eager"] / t[k] if "eager" in t else None
            point["vs_compile"][k] = t["torch.compile"] / t[k] if "torch.compile" in t else None
            tr = e["traffic"].get(k, e["traffic"].get("eager"))
            if tr and rec.get("bandwidth"):
                point["roof"][k] = floor_s(tr, rec) / (t[k] * 1e-3)
        out.append(point)
    return out


def curve_label(rec: dict, points: list[dict], label: str) -> str:
    """A row's name on the speed curve: with the rung it ran where that was one rung at every shape
    (auto->6_regcluster), else its own (a dispatching row picks again at each shape)."""
    names = {ran_label(label, p["rungs"]) for p in points if label in p["ms"]}
    return names.pop() if len(names) == 1 else label


def family_lines(rec: dict) -> list[str]:
    """The speed curve as a table: a row per shape, each timed label's median, then the best judged row's speedups
    and share of the ceiling."""
    points = curve(rec)
    if not points:
        return []
    labels = [k for k in row_names(rec) if any(k in p["ms"] for p in points)]
    w = max([14] + [len(str(p["shape"])) for p in points])
    cols = [max(9, len(curve_label(rec, points, k))) for k in labels]
    fw = max([7] + [len(ran_label(k, p["rungs"])) for p in points for k in p["vs_eager"]])
    lines = [
        "  at each shape timed (--shapes): median ms; the fastest judged row (the rung it ran there) against "
        "eager and torch.compile, and its share of the ceiling",
        f"  {'shape':{w}} {'member':>10} "
        + " ".join(f"{curve_label(rec, points, k):>{c}}" for k, c in zip(labels, cols))
        + f" {'fastest':>{fw}} {'vs eager':>8} {'vs comp':>7} {'%roof':>6}",
    ]
    for p in points:
        ms = " ".join(f"{p['ms'][k]:{c}.3f}" if k in p["ms"] else f"{'-':>{c}}" for k, c in zip(labels, cols))
        judged = [k for k in p["vs_eager"] if rec["rows"][k]["accepted"]] or list(p["vs_eager"])
        best = min(judged, key=lambda k: p["ms"][k]) if judged else None
        fmt = lambda v, suffix: f"{v:.2f}{suffix}" if v is not None else "-"
        tail = (
            f" {ran_label(best, p['rungs']):>{fw}} {fmt(p['vs_eager'][best], 'x'):>8} "
            f"{fmt(p['vs_compile'][best], 'x'):>7} "
            f"{fmt(100 * p['roof'][best] if best in p['roof'] else None, '%'):>6}"
            if best
            else ""
        )
        lines.append(f"  {str(p['shape']):{w}} {p['member']:>10} {ms}{tail}")
    return lines


def shapes_judged(rec: dict) -> str:
    """--shapes: every shape judged and how it went ('64x512 (the benchmark's), 63x511 (odd) right, 128x512
    (double) wrong'), a member not judged with why in a few words."""
    out = [f"{rec.get('judged_shape') or rec['shape']} (the benchmark's)"]
    for e in rec.get("family") or []:
        where = f"{e.get('shape') or 'not made'} ({e['member']})"
        if e.get("skipped"):
            out.append(f"{where} not judged: {e['skipped'].split(';')[0][:60]}")
        elif "passed" in e:
            out.append(f"{where} {'right' if e['passed'] else 'wrong'}")
        else:
            out.append(f"{where} not judged")
    return ", ".join(out)


def probes_lines(rec: dict) -> list[str]:
    """The reference's probes as a table (kp.judge.probes): each, whether every benchmark-shape call it saw accepted
    it, at how many calls, and the call and error that rejected it."""
    p = rec.get("probes")
    if not p:
        return ["probes: not run (parity did not run at the benchmark's shape here)"]
    out = [
        f"probes at {p['shape']}: what no kernel computes, judged as a candidate's output",
        f"{'probe':<36} {'verdict':<9} {'calls':>5}  rejected at",
    ]
    for name, r in p["probes"].items():
        said = "accepted" if r["accepted"] else "rejected"
        why = r.get("why") or (
            f"{r['at']}: relL2 {r['rel_l2']:.2e} over budget {r['budget']:.2e}"
            if "rel_l2" in r
            else f"{r.get('at', '-')} ({r.get('kind', '')})"
        )
        out.append(f"{name:<36} {said:<9} {r['calls']:>5}  {'-' if r['accepted'] else why}")
    out.append(f"weak: {', '.join(p['weak'])}" if p["weak"] else "weak: none (every probe was rejected)")
    return out


def checks_line(r: dict) -> str:
    """How many checked calls a row passed, by kind, in words, and at how many its gradients were checked too."""
    shapes = len({c.split(":")[0] for c in r["checks"] if c.startswith("at ")})
    kinds = {
        "trial": "on fresh inputs",
        "inputs": "on derived inputs",
        "case": "on declared cases",
        "at": f"at {shapes} other shape{'s' * (shapes != 1)} of its family (--shapes)",
        "timed": "among the timed calls",
    }
    passed = {c: v for c, v in r["checks"].items() if v.get("passed") is not False}
    n = {k: sum(1 for c in passed if c.split(" ")[0] == k) for k in kinds}
    changed = sum(1 for c in passed if c.startswith("trial") and ", after a" in c)
    parts = [
        f"{v} {kinds[k]}" + (f" ({changed} after a change of the weights)" if k == "trial" and changed else "")
        for k, v in n.items()
        if v
    ]
    n_all, n_failed = len(passed), len(r["checks"]) - len(passed)
    grads = sum(1 for c in passed.values() if c.get("grads") is not None)
    return (
        f"{n_all} checked call{'' if n_all == 1 else 's'} passed"
        + (f": {', '.join(parts)}" if parts else "")
        + (f"; gradients checked at {'every one' if grads == n_all else f'{grads} of them'}" if grads else "")
        + (f"; {n_failed} failed" if n_failed else "")
    )


def format_record(rec: dict, verdict_follows: bool = False) -> str:
    """The table (and the notes above it). verdict_follows: a verdict line with the reason and the judge's notes
    comes after the table, so a rejected row's column says only that and the notes are said there, once."""
    lines = _head_lines(rec, verdict_follows) + _table_lines(rec, verdict_follows) + _after_table_lines(rec)
    return "\n".join(lines)


def _head_lines(rec: dict, verdict_follows: bool) -> list[str]:
    """What was judged and how, the GPU memory it took, the ceilings measured, the skips and the notes."""
    gpu_peak = rec.get("peak_gpu_bytes")
    mode = {
        "train": "training mode (a fresh Model trains, as KernelBench builds it)",
        "eval": "eval mode (inference: both models in eval mode, calls under no_grad)",
    }.get(rec.get("mode"))
    head = (
        f"{rec['reference']} [{rec.get('shape', '')}] seed {rec['seed']} on {rec['device']}, torch {rec['torch']}"
        + (f", {mode}" if mode else "")
        + (f", precision {rec['precision']} (budget from PyTorch in that mode)" if rec["precision"] != "fp32" else "")
    )
    lines = [head]
    if gpu_peak is not None:
        fp = rec["footprint"]
        lines.append(
            f"peak GPU memory {gpu_peak / 2**30:.1f} GiB "
            f"(inputs + outputs {(fp['inputs'] + fp['outputs']) / 2**30:.2f} GiB, "
            f"weights {fp['weights'] / 2**30:.2f} GiB, {len(rec['rows'])} judged model(s); planned "
            f"{rec['memory_need'] / 2**30:.1f} GiB)"
        )
    if "bandwidth" in rec:
        c = f"ceilings measured now: device copy {rec['bandwidth'] / 1e9:,.0f} GB/s"
        if rec.get("flops_rate"):
            c += ", best of cuBLAS " + ", ".join(f"{k} {v / 1e12:.1f}" for k, v in rec["rates"].items()) + " TFLOP/s"
        lines.append(c + f"; bound: {rec['bound']}")
    for s in rec.get("skipped", []):
        lines.append(f"  skipped {s}")
    if rec.get("notes"):
        lines.append(f"  note: {rec['notes']}")
    for n in [] if verdict_follows else rec.get("notes_list") or []:  # else the verdict's (kp.observe.verdict)
        lines.append(f"  note: {n}")
    if list(rec["rows"]) == ["eager"] and not rec.get("timing"):
        lines.append(
            f"  the reference's own {rec.get('precision') or 'fp32'} Model judged against its float64 copy, "
            f"every parity stage (on {rec['device']}: nothing timed)"
        )
    return lines


def _table_lines(rec: dict, verdict_follows: bool) -> list[str]:
    """The table: a line per row, its timing where it was timed, its error and its verdict; then the training
    steps' rows (backward_lines)."""
    timing = rec.get("timing", {})
    timed = bool(timing) and "bandwidth" in rec  # no timing columns where nothing was timed (the CPU)
    unit = "TFLOP/s" if rec.get("bound") == "compute" else "GB/s"
    names = row_names(rec)
    w = max([16] + [len(row_label(rec, k)) for k in names])
    lines = [
        f"{'':{w}} "
        + (
            f"{'median ms':>9} {'IQR ms':>7} {unit:>8} {'%roof':>6} {'vs eager':>8} {'vs comp':>7} {'host us':>7} "
            if timed
            else ""
        )
        + f"{'relL2':>8} {'worst row':>9}  verdict"
    ]
    torch_err = max(
        [c.get("torch_rel_l2", 0.0) for r in rec["rows"].values() for c in r["checks"].values()], default=None
    )
    for k in names:
        cols = f"{row_label(rec, k):{w}}" + _timing_columns(rec, k, timed)
        r = rec["rows"].get(k)
        if r:
            cols += _verdict_columns(r, verdict_follows)
        elif k == "eager" and torch_err is not None:
            cols += f" {torch_err:8.1e} {'':9}  (PyTorch fp32's own error, worst call)"
        lines.append(cols)
    return lines + backward_lines(rec, w)


def _timing_columns(rec: dict, k: str, timed: bool) -> str:
    """A row's timing columns: its median and IQR, its rate and % of the roof, its speedups, its host time."""
    timing = rec.get("timing", {})
    t = timing.get(k)
    if not (t and "bandwidth" in rec):
        return " " * 62 if timed else ""
    scale, what = (1e12, "flops") if rec.get("bound") == "compute" else (1e9, "bytes")
    tr, secs, floor = row_traffic(rec, k), t["median_ms"] * 1e-3, row_floor_s(rec, k)
    ve = timing["eager"]["median_ms"] / t["median_ms"] if "eager" in timing else float("nan")
    vc = f"{timing['torch.compile']['median_ms'] / t['median_ms']:.2f}x" if "torch.compile" in timing else "-"
    return (
        f" {t['median_ms']:9.3f} {t['q3_ms'] - t['q1_ms']:7.3f} {tr[what] / secs / scale:8,.0f} "
        f"{100 * floor / secs:5.1f}% {ve:7.2f}x {vc:>7} {t['host_us']:7.0f}"
    )


def _verdict_columns(r: dict, verdict_follows: bool) -> str:
    """A judged row's error columns and verdict: an accepted row's worst over the calls it passed, a rejected row's
    at the call that failed (where its figures have them)."""
    errs = list(r["checks"].values())
    e = f"{max(c['rel_l2'] for c in errs):8.1e}" if errs else f"{'-':>8}"
    wr = f"{max(c['worst_row'] for c in errs):9.1e}" if errs else f"{'-':>9}"
    if not r["accepted"]:
        failed = (r.get("failure") or {}).get("figures") or {}
        e, wr = (
            (f"{failed['rel_l2']:8.1e}", f"{failed['worst_row']:9.1e}")
            if "rel_l2" in failed
            else (f"{'-':>8}", f"{'-':>9}")
        )
    kind = ""
    if r["pure_torch"]:
        kind = " (pure PyTorch)"
    elif r.get("library_kernels"):
        kind = " (a library's kernels)"
    if r["accepted"]:
        v = "accepted" + kind
    else:
        v = f"rejected{' (peer, not gated)' if r['peer'] else ''}" + ("" if verdict_follows else f": {r['reason']}")
    return f" {e} {wr}  {v}"


def _after_table_lines(rec: dict) -> list[str]:
    """Below the table: the speedups with their intervals, a ceiling the run contradicted, the rows' own kernels,
    the shape family, the profile and Nsight Compute's figures, the checked calls, the candidate's own frames."""
    timing, names, lines = rec.get("timing", {}), row_names(rec), []
    for k, got in (rec.get("speedups") or {}).items():  # each row's speedups, paired round by round (kp.lib.speedup)
        lines.append(
            f"  {row_label(rec, k)}: speedup with its {100 * speedup.LEVEL:.0f}% paired interval: "
            + ", ".join(f"{speedup.said(v)} vs {base}" for base, v in got.items())
        )
    over = [
        row_label(rec, k)
        for k in names
        if timing.get(k) and "bandwidth" in rec and row_floor_s(rec, k) > 1.02 * timing[k]["median_ms"] * 1e-3
    ]
    if over:
        lines.append(
            f"  note: {', '.join(over)} ran faster than the ceiling measured in this run allows: the ceiling "
            f"measured low (another process on the GPU, or the copy's placement), so %roof above 100 is not "
            f"a real figure; run again for one that holds"
        )
    for k, r in rec["rows"].items():
        if r.get("own_kernels"):
            lines.append(
                f"  {k}: own kernels "
                + "; ".join(f"{kernel_base_name(n)} ({lib})" for n, lib in list(r["own_kernels"].items())[:4])
            )
    lines += family_lines(rec)
    if rec.get("profile"):
        lines += format_profile(rec["profile"])
    if rec.get("ncu"):
        lines += format_ncu(rec["ncu"])
    if rec.get("family"):
        lines.append(f"  shapes judged: {shapes_judged(rec)}")
    said = {checks_line(r) for r in rec["rows"].values()}
    if len(said) == 1:
        lines.append(f"  {said.pop()}" + (" (each row)" if len(rec["rows"]) > 1 else ""))
    else:
        lines += [f"  {k}: {checks_line(r)}" for k, r in rec["rows"].items()]
    for k, r in rec["rows"].items():
        frames = own_frames(r.get("traceback"), r.get("path"))
        if frames:
            lines.append(f"  {k} raised in its own code (innermost last; the whole traceback is in the --json record):")
            lines += [f"    {f}" for f in frames]
    return lines
