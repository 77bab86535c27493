"""What many judgements are made of and leave behind: a job (one reference with one candidate, or a built-in
problem's own ladder, keyed by the contents that decide its verdict), the job file that lists them, and the JSON-lines
file of results a re-run resumes from, with its table."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import os
from pathlib import Path

from kp.errors import ACCEPTED, NO_VERDICT, REJECTED, STATUSES, UsageError
from kp.judge.options import JudgeOptions
from kp.lib.registry import KERNELS, MODELS, ROOT, problems
from kp.lib.sources import local_headers

# Options that bound how a job is run, not what it is: a recorded job is not judged again when only these change
# (a re-run with another --timeout resumes, it does not start over).
NOT_IN_KEY = ("timeout_s",)


@dataclasses.dataclass(frozen=True)
class Job:
    ref: tuple[str, str]  # ("file", absolute path) or ("problem", id)
    candidate: str | None  # absolute path; None: the problem's own ladder
    opts: tuple  # sorted (name, value) pairs of judge options (seed, trials, precision, device, bench, ...)

    @property
    def name(self) -> str:
        ref = Path(self.ref[1]).stem if self.ref[0] == "file" else self.ref[1]
        return f"{ref}: {Path(self.candidate).name}" if self.candidate else f"{ref} (ladder)"

    def key(self) -> str:
        """sha256 over what decides the verdict: the reference's and candidate's contents (a built-in problem's
        model, kernel sources and the headers they include), the options. Files are read now, so an edited file is a
        new job."""
        h = hashlib.sha256()
        if self.ref[0] == "file":
            h.update(b"ref-file:" + Path(self.ref[1]).read_bytes())
        else:
            h.update(b"problem:" + self.ref[1].encode())
            sources = sorted((KERNELS / self.ref[1]).glob("*.cu"))
            headers = sorted({hdr for src in sources for hdr in local_headers(src)})
            for f in [MODELS / f"{self.ref[1]}.py", *sources, *headers]:
                h.update(str(f.relative_to(ROOT)).encode() + b":" + f.read_bytes())
        if self.candidate:
            h.update(b"candidate:" + Path(self.candidate).read_bytes())
        h.update(json.dumps([kv for kv in self.opts if kv[0] not in NOT_IN_KEY]).encode())
        return h.hexdigest()[:24]

    def as_dict(self) -> dict:
        return {"ref": list(self.ref), "candidate": self.candidate, "opts": dict(self.opts)}


def make_job(ref: tuple[str, str], candidate: str | Path | None, opts: JudgeOptions | dict) -> Job:
    """A job: the reference, the candidate and the options (JudgeOptions, or a mapping of its fields, the others
    at their defaults)."""
    opts = opts if isinstance(opts, JudgeOptions) else JudgeOptions.from_mapping(opts)
    ref = (ref[0], str(Path(ref[1]).resolve())) if ref[0] == "file" else ref
    return Job(ref, str(Path(candidate).resolve()) if candidate else None, opts.pairs())


def read_job_file(path: str | Path, opts: JudgeOptions | dict) -> list[Job]:
    """A CSV with a header: `reference,candidate[,mode]`. A reference is a file or a built-in problem id; an empty
    candidate judges the problem's own ladder; `mode` (train or eval, optional) overrides --mode for that row, so
    one run can judge the same pairs under both semantics. Relative paths are relative to the CSV file."""
    path = Path(path)
    opts = opts if isinstance(opts, JudgeOptions) else JudgeOptions.from_mapping(opts)
    if not path.is_file():
        raise UsageError(f"job file {str(path)!r} does not exist")
    base = path.resolve().parent
    jobs = []
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for i, row in enumerate(rows, start=2):
        ref, cand = (row.get("reference") or "").strip(), (row.get("candidate") or "").strip()
        if not ref:
            raise UsageError(f"{path}:{i}: no reference (the header must be: reference,candidate)")
        spec = ("problem", ref) if ref in problems() else ("file", str(base / ref))
        if spec[0] == "file" and not Path(spec[1]).is_file():
            raise UsageError(f"{path}:{i}: {ref!r} is neither a file nor a built-in problem")
        if cand and not (base / cand).is_file():
            raise UsageError(f"{path}:{i}: candidate {cand!r} does not exist")
        if not cand and spec[0] == "file":
            raise UsageError(f"{path}:{i}: a reference file needs a candidate")
        mode = (row.get("mode") or "").strip()
        if mode and mode not in ("train", "eval"):
            raise UsageError(f"{path}:{i}: mode {mode!r} is neither train nor eval")
        jobs.append(make_job(spec, base / cand if cand else None, opts.replace(mode=mode) if mode else opts))
    return jobs


# ---------------------------------------------------------------------------------------------------------------
# Results that survive: one JSON line per finished job.


def read_results(out: Path) -> list[dict]:
    """The result lines of a JSON-lines file, the latest per job and file (identical files each have theirs; a torn
    last line, from a run killed mid-write, is ignored)."""
    by_key = {}
    if out.exists():
        for line in out.read_text().splitlines():
            try:
                d = json.loads(line)
                by_key[(d["key"], (d.get("job") or {}).get("candidate"))] = d
            except (ValueError, KeyError, TypeError):
                continue
    return list(by_key.values())


def with_reference_seeds(jobs: list[Job], earlier: list[dict]) -> list[Job]:
    """Jobs given no --seed judge every candidate of one reference on one seed sequence: the one its jobs already
    recorded in this results file (a resumed run keeps it), else one drawn from the OS for this run. Their
    candidates then meet the same inputs and weights, the reference's outputs are the same for each, and each
    job's record says the seed; a candidate's process never sees it (inputs are drawn in the judge's). The job's
    key stays that of a job without a seed, so a run resumes whatever seed it drew."""
    seeds: dict[str, int] = {}
    for d in earlier:
        job = d.get("job") or {}
        opts = job.get("opts") or {}
        seed = opts.get("seed")
        if isinstance(seed, int) and opts.get("seed_from") == "reference":
            seeds.setdefault(json.dumps(job.get("ref")), seed)
    out = []
    for job in jobs:
        opts = dict(job.opts)
        if opts.get("seed") is None:
            ref = json.dumps(list(job.ref))
            opts.update(seed=seeds.setdefault(ref, int.from_bytes(os.urandom(4), "little")), seed_from="reference")
            job = dataclasses.replace(job, opts=tuple(sorted(opts.items())))
        out.append(job)
    return out


def append_result(out: Path, line: dict) -> None:
    with open(out, "a") as f:
        f.write(json.dumps(line, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())


def summary(res: dict) -> dict:
    """Times of the judged row against the baselines, for the final table."""
    rec = res.get("record") or {}
    timing = rec.get("timing") or {}
    rows = rec.get("rows") or {}
    label = (
        "candidate"
        if "candidate" in rows
        else min(
            (k for k, r in rows.items() if r["accepted"] and k in timing),
            default=None,
            key=lambda k: timing[k]["median_ms"],
        )
    )
    t = timing.get(label) if label else None
    out = {"row": None if label == "candidate" else label, "ms": t["median_ms"] if t else None}
    paired = ((rec.get("speedups") or {}).get(label) or {}) if label else {}
    for base in ("eager", "torch.compile"):
        b = timing.get(base)
        out[f"vs_{base}"] = b["median_ms"] / t["median_ms"] if b and t else None
        # its paired interval (kp.lib.speedup): whether the samples tell the row from the baseline at all
        out[f"vs_{base}_significant"] = paired[base]["significant"] if base in paired else None
    return out


def _vs(s: dict, base: str) -> str:
    """A summary's speedup over a baseline as the table says it: '1.93x', or '1.01x n.s.' where its paired interval
    covers 1.0 (kp.lib.speedup)."""
    x = s.get(f"vs_{base}")
    if not x:
        return "-"
    return f"{x:.2f}x" + (" n.s." if s.get(f"vs_{base}_significant") is False else "")


def format_table(lines: list[dict]) -> str:
    """Accepted first, fastest against eager first; rejected after, with their reasons (and, where the candidate's
    own code raised, its innermost line). Columns that are empty in every row (nothing timed, one row per job) are
    left out."""
    from kp.observe.verdict import VERDICT_WIDTH, own_frames, verdict_within

    def sort_key(d):
        s = d.get("summary") or {}
        return (not d["ok"], -(s.get("vs_eager") or 0.0), d["job"]["name"])

    rows = sorted(lines, key=sort_key)
    w = max([20] + [len(d["job"]["name"]) for d in rows])
    g = max([4] + [len(str(d.get("gpu", "-"))) for d in rows])
    cols = [
        ("row", 16, lambda s: str(s.get("row") or "-")[-16:], "row"),
        ("ms", 8, lambda s: f"{s['ms']:.3f}" if s.get("ms") else "-", "ms"),
        ("vs eager", 12, lambda s: _vs(s, "eager"), "vs_eager"),
        ("vs comp", 12, lambda s: _vs(s, "torch.compile"), "vs_torch.compile"),
    ]
    cols = [c for c in cols if any((d.get("summary") or {}).get(c[3]) for d in rows)]
    out = [f"{'job':{w}} {'gpu':>{g}} " + "".join(f"{name:>{cw}} " for name, cw, _, _ in cols) + f"{'s':>5}  verdict"]
    for d in rows:
        s = d.get("summary") or {}
        cand = ((d.get("record") or {}).get("rows") or {}).get("candidate") or {}
        frames = own_frames(cand.get("traceback"), cand.get("path"), most=1) if not d["ok"] else []
        where = f" [at {frames[0].split(' in ')[0]}]" if frames else ""
        start = (
            f"{d['job']['name']:{w}} {str(d.get('gpu', '-')):>{g}} "
            + "".join(f"{f(s):>{cw}} " for _, cw, f, _ in cols)
            + f"{d.get('elapsed_s', 0):5.0f}  "
        )
        said = said_verdict(d)  # a row of at most VERDICT_WIDTH characters where the record can say it shorter
        if d.get("record") and len(start + said + where) > VERDICT_WIDTH and "candidate" in d["record"]["rows"]:
            said = verdict_within(d["record"], max(VERDICT_WIDTH - len(start + where), 80))
        out.append(start + said + where)
    n = {s: sum(status_of(d) == s for d in lines) for s in STATUSES}
    # --shapes: right at the benchmark's shape only
    only = sum(bool(((d.get("failure") or {}).get("member"))) for d in lines)
    # references a probe passed (kp.judge.probes): counted once per reference file
    weak = {json.dumps(d["job"].get("ref")) for d in lines if ((d.get("record") or {}).get("probes") or {}).get("weak")}
    out.append(
        f"{n[ACCEPTED]} accepted, {n[REJECTED]} rejected"
        + (f" ({only} of them right at the benchmark's shape only)" if only else "")
        + (f", {n[NO_VERDICT]} no verdict" if n[NO_VERDICT] else "")
        + (
            f"; {len(weak)} reference{'s' * (len(weak) != 1)} that cannot tell a right kernel from a probe "
            f"(their notes say which)"
            if weak
            else ""
        )
    )
    return "\n".join(out)


def said_verdict(line: dict) -> str:
    """A result's verdict as a batch's table and progress lines say it: a job that got none says `no verdict: why`
    (its verdict line is the single command's `error: why`)."""
    if status_of(line) == NO_VERDICT:
        return f"no verdict: {line['verdict'].removeprefix('error: ')}"
    return line["verdict"]


def status_of(line: dict) -> str:
    """A result line's status (accepted, rejected or no_verdict): its own (every line has one since lines had a
    status); for a line written before, what its data say, never its verdict's words: accepted where it is ok,
    rejected where it carries a failure or a record of a row that failed, else no verdict (a job that got none
    has no record)."""
    if line.get("status") in STATUSES:
        return line["status"]
    if line.get("ok"):
        return ACCEPTED
    rec = line.get("record") or {}
    failed = (
        line.get("failure")
        or rec.get("failure")
        or any(not r.get("accepted", True) for r in rec.get("rows", {}).values())
    )
    return REJECTED if failed else NO_VERDICT
