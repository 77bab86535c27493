"""The report: one table and one verdict line for the playground's variants and for candidates."""
from __future__ import annotations

import re

from kp.lib.numerics import over_budget
from kp.observe.profile import kernel_base_name

def kernelbench_line(r: dict) -> str | None:
    """KernelBench's own check on the same candidate (torch.allclose, atol = rtol), beside the verdict and never
    deciding it: "KernelBench 1e-4 pass, 1e-2 fail". None where it ran at no tolerance (a rejection before
    it, or out of GPU memory there): the record's `kernelbench` says why."""
    kb = r.get("kernelbench")
    if not kb or all(str(v).startswith("not") for v in kb.values()):
        return None
    word = lambda v: v if v in ("pass",) else v.split(" ")[0] + (" run" if v.startswith("not") else "")
    return "KernelBench " + ", ".join(f"{k} {word(v)}" for k, v in kb.items())


def own_frames(traceback: str | None, path: str | None, most: int = 3) -> list[str]:
    """The candidate's own frames of a traceback its call raised ("file.py:12 in forward: y = x.view(-1, 7)"),
    innermost last: where in its code the author should look. Frames of other files (torch, the judge) are left
    out; the record keeps the whole traceback."""
    import os
    if not traceback or not path:
        return []
    folder = os.path.dirname(os.path.realpath(path))
    out = []
    lines = traceback.splitlines()
    for i, ln in enumerate(lines):
        m = re.match(r'\s*File "([^"]+)", line (\d+), in (.+)', ln)
        if m and not m[1].startswith("<") and os.path.dirname(os.path.realpath(m[1])) == folder:  # "<frozen ...>":
            #                                                                              Python's own, not a file
            code = lines[i + 1].strip() if i + 1 < len(lines) and not lines[i + 1].lstrip().startswith("File ") \
                else ""
            out.append(f"{os.path.basename(m[1])}:{m[2]} in {m[3]}" + (f": {code}" if code else ""))
    return out[-most:]


def row_notes(rec: dict, r: dict) -> list[str]:
    """What a verdict line adds to accepted or rejected: how the weights reached the model, the extension builds
    that failed, the judge's own notes (no float64 reference), KernelBench's check."""
    notes = []
    if r.get("weights"):
        notes.append(f"weights: {r['weights']}")
    for f in {(f["extension"], f["error"]): f for f in r.get("build_failures") or []}.values():  # each build once
        notes.append(f"its extension {f['extension']!r} failed to build ({f['error']})"
                     + ("; judged as the PyTorch code it fell back to" if r["accepted"] else ""))
    notes += rec.get("notes_list") or []
    kb = kernelbench_line(r)
    if kb:
        notes.append(kb)
    return notes


def verdict(rec: dict, label: str = "candidate") -> str:
    """The one line: accepted or rejected with its reason, the notes, and the judge's seconds to reach it."""
    return _verdict(rec, label) + _took(rec)


def own_kernels_note(own: dict, most: int = 2) -> str:
    """'own kernels: _softmax_rows (Triton)': the kernels of the row's own that ran, each with its language (a
    library's file name stays in the record)."""
    names = [f"{kernel_base_name(n)[:40]} ({lang.split(',')[0]})" for n, lang in own.items()]
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return f"own kernel{'s' if len(names) > 1 else ''}: {', '.join(names[:most])}{more}"


VERDICT_WIDTH = 200  # the printed verdict line's most characters: what does not fit goes on the lines above it


def verdict_lines(rec: dict, label: str = "candidate") -> list[str]:
    """The verdict as a command prints it: its last line starts with accepted or rejected and is at most
    VERDICT_WIDTH characters. Where the one line (`verdict`, what the record and a batch keep) is longer, its notes
    go on lines of their own above it (`  note: `), then a rejection's explanation after its figures (`  why: `);
    a reason still too long is cut on the last line and said whole above it (`  reason: `)."""
    line = verdict(rec, label)
    if len(line) <= VERDICT_WIDTH:
        return [line]
    head, notes = _verdict_parts(rec, label)
    above = [f"  note: {n}" for n in notes]
    if not rec["rows"][label]["accepted"]:
        reason = head[len("rejected: "):]
        core, why = split_explanation(reason)
        if why:
            above.append(f"  why: {why}")
        if len(f"rejected: {core}{_took(rec)}") > VERDICT_WIDTH:  # shortened on the last line: whole here
            above.append(f"  reason: {reason}")
    return above + [_short_verdict(rec, label, VERDICT_WIDTH, "above")]


def verdict_within(rec: dict, width: int, label: str = "candidate") -> str:
    """The one-line verdict in at most `width` characters where it can be (a table's row): whole where it fits,
    else without its notes (the record keeps them) and with a rejection's reason shortened as verdict_lines does."""
    line = verdict(rec, label)
    return line if len(line) <= width else _short_verdict(rec, label, width, "in the record")


def _took(rec: dict) -> str:
    return f" in {rec['elapsed_s']:.1f} s" if rec.get("elapsed_s") is not None else ""


def _short_verdict(rec: dict, label: str, width: int, notes_where: str) -> str:
    """The verdict without its notes ('(notes <notes_where>)' said where it has some), a rejection as what failed
    with its figures (its explanation left out), shortened to `width` where that is still longer."""
    head, notes = _verdict_parts(rec, label)
    took = _took(rec)
    if rec["rows"][label]["accepted"]:
        return f"{head}{took}" + (f" (notes {notes_where})" if notes else "")
    core, _ = split_explanation(head[len("rejected: "):])
    return f"rejected: {shorten(core, width - len(took) - len('rejected: '))}{took}"


def shorten(text: str, width: int) -> str:
    """`text` in at most `width` characters, keeping what names the failure and its figures: the longest
    parenthesised aside (over 24 characters) but the last (the worst row's figures) becomes '(...)' until it fits,
    then, if it still does not, the middle is cut (cut_middle)."""
    while len(text) > width:
        groups, depth, start = [], 0, 0
        for i, ch in enumerate(text):
            if ch == "(":
                depth += 1
                start = i if depth == 1 else start
            elif ch == ")" and depth:
                depth -= 1
                if depth == 0 and i - start > 24:  # a seed or a size stays
                    groups.append((start, i))
        if len(groups) < 2:
            break
        a, b = max(groups[:-1], key=lambda g: g[1] - g[0])
        text = text[:a] + "(...)" + text[b + 1:]
    return cut_middle(text, width)


def cut_middle(text: str, width: int) -> str:
    """`text` in at most `width` characters: its start (where it failed) and its end (the figures), the middle cut
    at word boundaries and marked ' ... '."""
    if len(text) <= width:
        return text
    room = width - len(" ... ")
    head, tail = text[:room // 2], text[len(text) - (room - room // 2):]
    head = head[:head.rfind(" ")] if " " in head else head
    tail = tail[tail.find(" ") + 1:] if " " in tail else tail
    return f"{head} ... {tail}"


def split_explanation(reason: str) -> tuple[str, str]:
    """(what failed, with its figures; the explanation the judge adds after them): a reason split at its first
    '; ' outside parentheses ('trial 2 (...): relL2 ... over budget ...; it passed before the weights changed ...'),
    or (reason, '') where it has none."""
    depth = 0
    for i, ch in enumerate(reason):
        depth += (ch in "([") - (ch in ")]")
        if depth == 0 and reason.startswith("; ", i) and reason[i + 2:].strip():
            return reason[:i], reason[i + 2:]
    return reason, ""


def _verdict(rec: dict, label: str) -> str:
    head, notes = _verdict_parts(rec, label)
    return head + (f" ({'; '.join(notes)})" if notes else "")


def _verdict_parts(rec: dict, label: str) -> tuple[str, list[str]]:
    """('accepted' or 'rejected: <reason>', the notes the verdict adds in parentheses)."""
    r = rec["rows"][label]
    box = rec.get("sandbox", "")
    # asked for, not available: always said, in short (the record's `sandbox` has the whole reason)
    unboxed = f"unboxed: {box.split(': ', 1)[1].split(' (')[0]}" if box.startswith("unsandboxed: ") else None
    if not r["accepted"]:
        return f"rejected: {r['reason']}", row_notes(rec, r) + ([unboxed] if unboxed else [])
    notes = []
    if rec.get("stages_not_run"):  # on the CPU: --allow-torch or not, whether a kernel of its own runs is not seen
        notes.append(f"parity only on {rec['device']}: {', '.join(rec['stages_not_run'])} need a GPU")
    if rec.get("not_proven"):  # judged at a smaller shape of the family only: right there, not shown right beyond
        notes.append(rec["not_proven"])
    if r.get("pure_torch"):
        notes.append("pure PyTorch: no kernel of its own ran (--allow-torch)")
    elif r.get("own_kernels"):
        notes.append(own_kernels_note(r["own_kernels"]))
    if rec.get("mode") == "eval":
        notes.append("eval mode: inference semantics")
    if unboxed:
        notes.append(unboxed)
    notes += row_notes(rec, r)
    return "accepted", notes


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
        lines.append(f"{row_label(rec, k):{w}} {t['median_ms']:9.3f} {t['q3_ms'] - t['q1_ms']:7.3f} {ve:7.2f}x "
                     f"{vc:>7}")
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
    return max(traffic["bytes"] / rec["bandwidth"],
               traffic["flops"] / rec["flops_rate"] if rec.get("flops_rate") else 0.0)


def curve(rec: dict) -> list[dict]:
    """The speed curve of a record timed with --shapes: one point per shape timed (the benchmark's first, then the
    family's members in order): shape, member, each timed label's median ms, and, per judged row, its speedup over
    eager and torch.compile and its share of the copy/GEMM ceiling measured in the run (None where not measured)."""
    out = []
    members = [{"shape": rec.get("shape"), "member": "benchmark", "timing": rec.get("timing") or {},
                "traffic": rec.get("traffic") or {}, "rungs": rec.get("rungs") or {}}] + \
        [e for e in rec.get("family") or [] if e.get("timing")]
    if len(members) < 2 or not members[0]["timing"]:
        return []
    for e in members:
        t = {k: v["median_ms"] for k, v in e["timing"].items()}
        point = {"shape": e["shape"], "member": e["member"], "ms": t, "vs_eager": {}, "vs_compile": {}, "roof": {},
                 "rungs": e.get("rungs") or {}}
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
    lines = ["  at each shape timed (--shapes): median ms; the fastest judged row (the rung it ran there) against "
             "eager and torch.compile, and its share of the ceiling",
             f"  {'shape':{w}} {'member':>10} " + " ".join(f"{curve_label(rec, points, k):>{c}}"
                                                           for k, c in zip(labels, cols))
             + f" {'fastest':>{fw}} {'vs eager':>8} {'vs comp':>7} {'%roof':>6}"]
    for p in points:
        ms = " ".join(f"{p['ms'][k]:{c}.3f}" if k in p["ms"] else f"{'-':>{c}}" for k, c in zip(labels, cols))
        judged = [k for k in p["vs_eager"] if rec["rows"][k]["accepted"]] or list(p["vs_eager"])
        best = min(judged, key=lambda k: p["ms"][k]) if judged else None
        fmt = lambda v, suffix: f"{v:.2f}{suffix}" if v is not None else "-"
        tail = (f" {ran_label(best, p['rungs']):>{fw}} {fmt(p['vs_eager'][best], 'x'):>8} "
                f"{fmt(p['vs_compile'][best], 'x'):>7} "
                f"{fmt(100 * p['roof'][best] if best in p['roof'] else None, '%'):>6}"
                if best else "")
        lines.append(f"  {str(p['shape']):{w}} {p['member']:>10} {ms}{tail}")
    return lines


def checks_line(r: dict) -> str:
    """How many checked calls a row passed, by kind, in words."""
    shapes = len({c.split(":")[0] for c in r["checks"] if c.startswith("at ")})
    kinds = {"trial": "on fresh inputs", "inputs": "on derived inputs", "case": "on declared cases",
             "at": f"at {shapes} other shape{'s' * (shapes != 1)} of its family (--shapes)",
             "timed": "timed calls checked"}
    n = {k: sum(1 for c in r["checks"] if c.split(" ")[0] == k) for k in kinds}
    changed = sum(1 for c in r["checks"] if c.startswith("trial") and ", after a" in c)
    parts = [f"{v} {kinds[k]}" + (f" ({changed} after a change of the weights)" if k == "trial" and changed else "")
             for k, v in n.items() if v]
    n_all = len(r["checks"])
    return f"{n_all} checked call{'' if n_all == 1 else 's'} passed" + (f": {', '.join(parts)}" if parts else "")


def format_record(rec: dict, verdict_follows: bool = False) -> str:
    """The table (and the notes above it). verdict_follows: a verdict line with the reason comes after the table,
    so a rejected row's column says only that."""
    gpu_peak = rec.get("peak_gpu_bytes")
    mode = {"train": "training mode (a fresh Model trains, as KernelBench builds it)",
            "eval": "eval mode (inference: both models in eval mode, calls under no_grad)"}.get(rec.get("mode"))
    head = (f"{rec['reference']} [{rec.get('shape', '')}] seed {rec['seed']} on {rec['device']}, torch {rec['torch']}"
            + (f", {mode}" if mode else "")
            + (f", precision {rec['precision']} (budget from PyTorch in that mode)"
               if rec["precision"] != "fp32" else ""))
    lines = [head]
    if gpu_peak is not None:
        fp = rec["footprint"]
        lines.append(f"peak GPU memory {gpu_peak / 2**30:.1f} GiB "
                     f"(inputs + outputs {(fp['inputs'] + fp['outputs']) / 2**30:.2f} GiB, "
                     f"weights {fp['weights'] / 2**30:.2f} GiB, {len(rec['rows'])} judged model(s); planned "
                     f"{rec['memory_need'] / 2**30:.1f} GiB)")
    if "bandwidth" in rec:
        c = f"ceilings measured now: device copy {rec['bandwidth'] / 1e9:,.0f} GB/s"
        if rec.get("flops_rate"):
            c += ", best of cuBLAS " + ", ".join(f"{k} {v / 1e12:.1f}" for k, v in rec["rates"].items()) + " TFLOP/s"
        lines.append(c + f"; bound: {rec['bound']}")
    for s in rec.get("skipped", []):
        lines.append(f"  skipped {s}")
    if rec.get("notes"):
        lines.append(f"  note: {rec['notes']}")
    for n in rec.get("notes_list") or []:
        lines.append(f"  note: {n}")
    if list(rec["rows"]) == ["eager"] and not rec.get("timing"):
        lines.append(f"  the reference's own {rec.get('precision') or 'fp32'} Model judged against its float64 copy, "
                     f"every parity stage (on {rec['device']}: nothing timed)")
    timing = rec.get("timing", {})
    timed = bool(timing) and "bandwidth" in rec  # no timing columns where nothing was timed (the CPU)
    compute = rec.get("bound") == "compute"
    unit, scale, what = ("TFLOP/s", 1e12, "flops") if compute else ("GB/s", 1e9, "bytes")
    names = row_names(rec)
    label_of = lambda k: row_label(rec, k)
    w = max([16] + [len(label_of(k)) for k in names])
    lines.append(f"{'':{w}} " + (f"{'median ms':>9} {'IQR ms':>7} {unit:>8} {'%roof':>6} {'vs eager':>8} "
                                 f"{'vs comp':>7} {'host us':>7} " if timed else "")
                 + f"{'relL2':>8} {'worst row':>9}  verdict")
    torch_err = max([c.get("torch_rel_l2", 0.0) for r in rec["rows"].values() for c in r["checks"].values()],
                    default=None)
    for k in names:
        t = timing.get(k)
        cols = f"{label_of(k):{w}}"
        if t and "bandwidth" in rec:
            tr, secs, floor = row_traffic(rec, k), t["median_ms"] * 1e-3, row_floor_s(rec, k)
            ve = timing["eager"]["median_ms"] / t["median_ms"] if "eager" in timing else float("nan")
            vc = (f"{timing['torch.compile']['median_ms'] / t['median_ms']:.2f}x" if "torch.compile" in timing
                  else "-")
            cols += (f" {t['median_ms']:9.3f} {t['q3_ms'] - t['q1_ms']:7.3f} {tr[what] / secs / scale:8,.0f} "
                     f"{100 * floor / secs:5.1f}% {ve:7.2f}x {vc:>7} {t['host_us']:7.0f}")
        elif timed:
            cols += " " * 62
        r = rec["rows"].get(k)
        if r:
            errs = list(r["checks"].values())  # an accepted row: the worst of the calls it passed
            e = f"{max(c['rel_l2'] for c in errs):8.1e}" if errs else f"{'-':>8}"
            wr = f"{max(c['worst_row'] for c in errs):9.1e}" if errs else f"{'-':>9}"
            if not r["accepted"]:  # a rejected row: the call that failed, where its reason has the figures
                failed = over_budget(r["reason"])
                e, wr = (f"{failed[0].rel_l2:8.1e}", f"{failed[0].worst_row:9.1e}") if failed else \
                    (f"{'-':>8}", f"{'-':>9}")
            v = ("accepted" + (" (pure PyTorch)" if r["pure_torch"] else "")) if r["accepted"] else \
                (f"rejected{' (peer, not gated)' if r['peer'] else ''}" +
                 ("" if verdict_follows else f": {r['reason']}"))
            cols += f" {e} {wr}  {v}"
        elif k == "eager" and torch_err is not None:
            cols += f" {torch_err:8.1e} {'':9}  (PyTorch fp32's own error, worst call)"
        lines.append(cols)
    lines += backward_lines(rec, w)
    over = [label_of(k) for k in names if timing.get(k) and "bandwidth" in rec
            and row_floor_s(rec, k) > 1.02 * timing[k]["median_ms"] * 1e-3]
    if over:
        lines.append(f"  note: {', '.join(over)} ran faster than the ceiling measured in this run allows: the ceiling "
                     f"measured low (another process on the GPU, or the copy's placement), so %roof above 100 is not "
                     f"a real figure; run again for one that holds")
    for k, r in rec["rows"].items():
        if r.get("own_kernels"):
            lines.append(f"  {k}: own kernels " + "; ".join(f"{kernel_base_name(n)} ({lib})" for n, lib in
                                                           list(r["own_kernels"].items())[:4]))
    lines += family_lines(rec)
    if rec.get("profile"):
        from kp.observe.profile import format_profile
        lines += format_profile(rec["profile"])
    if rec.get("ncu"):
        from kp.observe.ncu import format_ncu
        lines += format_ncu(rec["ncu"])
    said = {checks_line(r) for r in rec["rows"].values()}
    if len(said) == 1:
        lines.append(f"  {said.pop()}" + (" (each row)" if len(rec["rows"]) > 1 else ""))
    else:
        lines += [f"  {k}: {checks_line(r)}" for k, r in rec["rows"].items()]
    for k, r in rec["rows"].items():
        frames = own_frames(r.get("traceback"), r.get("path"))
        if frames:
            lines.append(f"  {k} raised in its own code (innermost last; the whole traceback is in the --json "
                         f"record):")
            lines += [f"    {f}" for f in frames]
    return "\n".join(lines)
