"""The verdict: one line saying accepted or rejected with its reason, the notes it adds, and the judge's seconds; as a
command prints it (its last line at most VERDICT_WIDTH characters) and as a table's row holds it."""

from __future__ import annotations

import re

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
        # "<frozen ...>": Python's own, not a file
        if m and not m[1].startswith("<") and os.path.dirname(os.path.realpath(m[1])) == folder:
            code = lines[i + 1].strip() if i + 1 < len(lines) and not lines[i + 1].lstrip().startswith("File ") else ""
            out.append(f"{os.path.basename(m[1])}:{m[2]} in {m[3]}" + (f": {code}" if code else ""))
    return out[-most:]


def row_notes(rec: dict, r: dict) -> list[str]:
    """What a verdict line adds to accepted or rejected: how the weights reached the model, the extension builds
    that failed, the judge's own notes (no float64 reference), KernelBench's check."""
    notes = []
    if r.get("weights"):
        notes.append(f"weights: {r['weights']}")
    for f in {(f["extension"], f["error"]): f for f in r.get("build_failures") or []}.values():  # each build once
        notes.append(
            f"its extension {f['extension']!r} failed to build ({f['error']})"
            + ("; judged as the PyTorch code it fell back to" if r["accepted"] else "")
        )
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
        reason = head[len("rejected: ") :]
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
    core, _ = split_explanation(head[len("rejected: ") :])
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
        text = text[:a] + "(...)" + text[b + 1 :]
    return cut_middle(text, width)


def cut_middle(text: str, width: int) -> str:
    """`text` in at most `width` characters: its start (where it failed) and its end (the figures), the middle cut
    at word boundaries and marked ' ... '."""
    if len(text) <= width:
        return text
    room = width - len(" ... ")
    head, tail = text[: room // 2], text[len(text) - (room - room // 2) :]
    head = head[: head.rfind(" ")] if " " in head else head
    tail = tail[tail.find(" ") + 1 :] if " " in tail else tail
    return f"{head} ... {tail}"


def split_explanation(reason: str) -> tuple[str, str]:
    """(what failed, with its figures; the explanation the judge adds after them): a reason split at its first
    '; ' outside parentheses ('trial 2 (...): relL2 ... over budget ...; it passed before the weights changed ...'),
    or (reason, '') where it has none."""
    depth = 0
    for i, ch in enumerate(reason):
        depth += (ch in "([") - (ch in ")]")
        if depth == 0 and reason.startswith("; ", i) and reason[i + 2 :].strip():
            return reason[:i], reason[i + 2 :]
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
    elif r.get("library_kernels"):
        notes.append(
            f"a library's kernels: {', '.join(r['library_kernels'][:3])}; no kernel of its own ran (--allow-torch)"
        )
    elif r.get("own_kernels"):
        notes.append(own_kernels_note(r["own_kernels"]))
    if rec.get("mode") == "eval":
        notes.append("eval mode: inference semantics")
    if unboxed:
        notes.append(unboxed)
    notes += row_notes(rec, r)
    return "accepted", notes
