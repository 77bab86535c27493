"""Judge a corpus of KernelBench-format references and candidates, and classify the verdicts by cause.

  python -m tools.judge_corpus refs DIR [--device cpu] [--procs 2] [--timeout 900] [--precision bf16] [--every N]
                             --out refs.jsonl
      `run.py --ref FILE` alone for every *.py in DIR (on the CPU: the reference's own Model against its float64
      copy, every parity stage): one JSON line per reference with the exit code, the last line and whether a
      traceback was printed, and the reference's probes that passed (kp.judge.probes). Re-running skips the
      references already recorded. A reference left without a verdict (exit 2) beside the others on a GPU is
      judged again alone at the end: most often the GPU memory they held.
  python -m tools.judge_corpus jobs LEADERBOARD_DIR --csv jobs.csv [--every N] [--modes train,eval]
      a job file (reference,candidate) from the KernelBench leaderboard's layout: problems/l{L}_p{N}.py,
      solutions/<hash>.py and data.json ("Level L: N_Name" -> [{"file": hash, ...}]); then judge it with
      `python run.py --jobs jobs.csv --allow-torch --no-compile --no-bench --out results.jsonl [--gpus all]`.
  python -m tools.judge_corpus warm jobs.csv [--procs 8] [--device cuda]
      import every candidate of a job file that builds its own extension once, several at a time, in its box, so
      its build lands in the folder the judge keeps for it (kp.batch.ahead, which `run.py --jobs` also runs where
      a run has more such candidates than slots) before the GPUs judge them one by one.
  python -m tools.judge_corpus classify results.jsonl [--md]
      the verdicts of such a run by cause (one example each), and how KernelBench's own check compares.
  python -m tools.judge_corpus pace before.jsonl after.jsonl
      where each run's job-seconds went: waiting for a GPU, the candidates' builds, the judging.
  python -m tools.judge_corpus compare before.jsonl after.jsonl
      the jobs whose verdict changed between two runs of one job file, each with both verdicts.
  python -m tools.judge_corpus floors results.jsonl
      every rejection over the error budget read again against today's floor: the reference's longest reduction
      (kp.lib.op_modes.ReductionLength, traced on the meta device) and whether the recorded error fits under it. A
      re-reading of the failed check only: the checks after it were not run.

The corpora themselves are public (KernelBench's references, its leaderboard's machine-written solutions) and are
not part of this repository.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures as cf
import csv
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cause(line: dict) -> str:
    """What a result line's verdict came to, from its data, never its words: an acceptance by whose kernels ran, a
    job without a verdict by why where the line says (the GPU's memory, the judge's own error), a rejection by its
    failure's kind (kp.errors.FAILURE_KINDS) and, for a wrong output, whether a timed call or a derived input
    showed it."""
    from kp.batch.jobfile import status_of
    from kp.errors import ACCEPTED, FAILURE_KINDS, NO_VERDICT

    status = status_of(line)
    rec = line.get("record") or {}
    row = (rec.get("rows") or {}).get("candidate") or {}
    if status == ACCEPTED:
        if row.get("own_kernels"):
            return "accepted, own kernel"
        return "accepted, a library's kernels" if row.get("library_kernels") else "accepted, pure PyTorch"
    if status == NO_VERDICT:
        if line.get("gpu_memory"):
            return "no verdict: the GPU's memory (shared, or the plan did not hold)"
        return "no verdict: the judge's own error" if line.get("traceback") else "no verdict"
    failure = line.get("failure") or rec.get("failure") or {}
    kind = failure.get("kind")
    if kind not in FAILURE_KINDS:
        return "rejected, kind not recorded"
    label = failure.get("check") or ""
    at = next((f" ({what})" for start, what in CALL_KINDS if label.startswith(start)), "")
    return f"{kind}: {FAILURE_KINDS[kind]}" + (at if kind == "wrong_output" else "")


# (start of a checked call's label, what it is): where a wrong output was seen
CALL_KINDS = [
    ("timed call", "at a timed call"),
    ("inputs negated", "at a derived input"),
    ("inputs scaled", "at a derived input"),
    ("inputs shifted", "at a derived input"),
    ("at ", "at another shape of its family"),
]


def kernelbench(line: dict) -> str:
    """KernelBench's own check as 'pass/fail' per tolerance, from the record."""
    rows = (line.get("record") or {}).get("rows") or {}
    kb = (rows.get("candidate") or {}).get("kernelbench") or {}
    if not kb:
        return "-"
    return ", ".join(f"{'pass' if v == 'pass' else v.split(' ')[0]} {k}" for k, v in kb.items())


def classify(path: Path, md: bool) -> str:
    """One table per mode (a job file with a mode column judges the same pairs under both)."""
    from kp.batch.jobfile import read_results

    lines = read_results(path)
    modes = collections.defaultdict(list)
    for d in lines:
        modes[d["job"]["opts"].get("mode", "train")].append(d)
    return "\n\n".join((f"mode {m}: " if len(modes) > 1 else "") + _classify(ls, md) for m, ls in modes.items())


def _classify(lines: list[dict], md: bool) -> str:
    by = collections.defaultdict(list)
    for d in lines:
        by[cause(d)].append(d)
    order = sorted(by, key=lambda c: (not c.startswith("accepted"), not c.startswith("no verdict"), -len(by[c]), c))
    out = [f"{len(lines)} jobs"]
    if md:
        out += ["", "| cause | jobs | example (job: verdict) |", "|---|---|---|"]
    for c in order:
        ex = by[c][0]
        text = f"{ex['job']['name']}: {ex['verdict'][:220]}"
        out.append(f"| {c} | {len(by[c])} | {text} |" if md else f"{len(by[c]):5d}  {c:45s} e.g. {text}")
    combos = collections.Counter((("accepted" if d["ok"] else "rejected"), kernelbench(d)) for d in lines)
    out += ["", "ours vs KernelBench's own check (allclose at atol = rtol = 1e-4 and 1e-2):"]
    if md:
        out += ["", "| our verdict | KernelBench's check | jobs |", "|---|---|---|"]
    for (ours, kb), n in sorted(combos.items()):
        out.append(f"| {ours} | {kb} | {n} |" if md else f"{n:5d}  {ours:9s} kernelbench {kb}")
    return "\n".join(out)


def leaderboard_jobs(
    root: Path, csv_path: Path, every: int = 1, modes: tuple[str, ...] = (), count: int | None = None
) -> int:
    """Every `every`-th pair (or `count` pairs evenly spread), in the data file's order (levels 1 to 3, problem by
    problem); paths relative to the job file, as run.py --jobs reads them. With `modes`, one row per pair and mode, a
    pair's modes next to each other (the second finds the candidate's extension already built)."""
    import os

    assets = root / "docs" / "assets" if (root / "docs" / "assets").is_dir() else root
    data = json.loads((assets / "data.json").read_text())
    rows = []
    for key, sols in data.items():
        m = re.match(r"Level (\d+): (\d+)_", key)
        if not m:
            continue
        ref = assets / "problems" / f"l{m[1]}_p{m[2]}.py"
        for s in sols:
            cand = assets / "solutions" / f"{s['file']}.py"
            if ref.is_file() and cand.is_file():
                rows.append(tuple(os.path.relpath(p, csv_path.resolve().parent) for p in (ref, cand)))
    rows = rows[::every]
    if count and count < len(rows):
        rows = [rows[i * len(rows) // count] for i in range(count)]
    if modes:
        rows = [(*r, m) for r in rows for m in modes]
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["reference", "candidate", *(["mode"] if modes else [])])
        w.writerows(rows)
    return len(rows)


def _judge_ref(path: Path, device: str, timeout: float, precision: str = "fp32") -> dict:
    import tempfile

    t0 = time.perf_counter()
    cmd = [sys.executable, str(ROOT / "run.py"), "--ref", str(path), "--seed", "1", "--precision", precision]
    cmd += ["--device", device] if device == "cpu" else ["--no-compile", "--no-bench"]
    with tempfile.TemporaryDirectory(prefix="kp-ref-") as tmp:
        rec_path = Path(tmp) / "record.json"
        try:
            r = subprocess.run(
                [*cmd, "--json", str(rec_path)], capture_output=True, text=True, timeout=timeout, cwd=ROOT
            )
            code, out, err = r.returncode, r.stdout, r.stderr
        except subprocess.TimeoutExpired:
            code, out, err = None, "", f"no answer within {timeout:.0f} s"
        try:  # the reference's probes (kp.judge.probes), as data: which passed, at which shape
            probes = json.loads(rec_path.read_text()).get("probes")
        except (OSError, ValueError):
            probes = None
    lines = [ln for ln in (out + "\n" + err).splitlines() if ln.strip() and not ln.startswith("[kp]")]
    return {
        "probes": {"shape": probes["shape"], "weak": probes["weak"]} if probes else None,
        "ref": path.name,
        "code": code,
        "traceback": "Traceback" in err,
        "elapsed_s": round(time.perf_counter() - t0, 1),
        "eager": next((ln for ln in lines if ln.startswith("eager")), ""),
        "skipped": [ln.strip() for ln in lines if ln.strip().startswith("skipped")],
        "notes": [ln.strip() for ln in lines if ln.strip().startswith("note:")],
        "last": lines[-1] if lines else "",
    }


def judge_refs(
    folder: Path, out: Path, device: str, procs: int, timeout: float, precision: str = "fp32", every: int = 1
) -> None:
    """Several references at a time on one GPU share its memory: one left without a verdict for GPU memory (exit 2,
    GpuMemoryShort) is judged again alone once the rest are done, and only that answer is recorded
    (`"alone": true`). Measured: five bf16 references at a time on an 80 GB card left 25_Swish without a verdict."""
    done = {json.loads(ln)["ref"] for ln in out.read_text().splitlines() if ln.strip()} if out.exists() else set()
    todo = [p for p in sorted(folder.glob("*.py"))[::every] if p.name not in done]
    again = []
    with cf.ThreadPoolExecutor(procs) as ex, open(out, "a") as f:

        def record(res):
            f.write(json.dumps(res) + "\n")
            f.flush()
            print(f"{res['ref']}: exit {res['code']} {res['elapsed_s']} s {res['last'][:150]}", flush=True)

        for path, res in zip(todo, ex.map(lambda p: _judge_ref(p, device, timeout, precision), todo)):
            if device != "cpu" and procs > 1 and res["code"] == 2:
                print(
                    f"{res['ref']}: no verdict beside the other references (their GPU memory, most likely): judged "
                    f"again alone at the end",
                    flush=True,
                )
                again.append(path)
            else:
                record(res)
        for path in again:
            record({**_judge_ref(path, device, timeout, precision), "alone": True})


def warm(csv_path: Path, procs: int, timeout: float, device: str) -> None:
    """Every candidate of the job file that builds its own extension, imported once as the judge's import stage
    does (kp.batch.ahead: in its box, into the build folder the judge keeps for it), `procs` at a time; those a
    build ahead imported cleanly before are passed by."""
    from kp.batch import ahead, jobfile

    own, jobs = ahead.own_and_unbuilt(jobfile.read_job_file(csv_path, {"device": device}))
    print(f"{len(own) - len(jobs)} found built before", flush=True)
    t0 = time.perf_counter()
    res = ahead.build_ahead(jobs, procs, timeout)
    for cand, why in res.items():
        print(f"{Path(cand).name}: {why or 'ok'}", flush=True)
    print(f"warmed {sum(v is None for v in res.values())}/{len(res)} candidates in {time.perf_counter() - t0:.0f} s")


def _reduction_length(ref: Path) -> float:
    import importlib.util
    import torch
    from kp.lib.op_modes import ReductionLength

    spec = importlib.util.spec_from_file_location("kp_corpus_ref", ref)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with torch.device("meta"):
        model, x, k = mod.Model(*mod.get_init_inputs()), mod.get_inputs(), ReductionLength()
        with torch.no_grad(), k:
            model(*x)
    return k.k


def floors(path: Path) -> str:
    from kp.lib.numerics import accumulation_floor
    from kp.batch.jobfile import read_results

    out, ks = [], {}
    for line in read_results(path):
        figs = ((line.get("record") or {}).get("failure") or {}).get("figures") or {}
        if "rel_l2" not in figs:  # no budget failed (or a record older than the failure's figures)
            continue
        rel, row, b, b_row = figs["rel_l2"], figs["worst_row"], figs["budget"], figs["row_budget"]
        ref = line["job"]["ref"][1]
        if ref not in ks:
            try:
                ks[ref] = _reduction_length(Path(ref))
            except Exception as e:  # a reference the meta device cannot run: said, not guessed
                ks[ref] = None
                out.append(f"{line['job']['name']}: the reference does not run on the meta device ({e})")
        if ks[ref] is None:
            continue
        f = accumulation_floor(ks[ref])
        fits = rel <= max(b, f) and row <= max(b_row, f)
        out.append(
            f"{line['job']['name']} ({line['job']['opts'].get('mode', 'train')}): K {ks[ref]:.0f}, floor "
            f"{f:.2e}; relL2 {rel:.2e} (worst row {row:.2e}) against {max(b, f):.2e} ({max(b_row, f):.2e}): "
            f"{'within the budget now' if fits else 'still over'}"
        )
    return "\n".join(out)


AHEAD = "ahead of the job"  # the end of a stage detail's name: the reference ran in the job's box beforehand


def pace(paths: list[Path]) -> str:
    """Where each run's job-seconds went (its records' elapsed_s, gpu_wait_s and stage_seconds), a markdown row per
    results file: verdicts, job-seconds, the share spent waiting for a GPU, in the candidates' builds, in setup (the
    reference run once in the candidate's process, or the timing's baselines built there), the rest; how many jobs
    found the reference already run in their box (kp.batch.prime)."""
    from kp.batch.jobfile import read_results

    out = [
        "| run | verdicts | job-seconds | waiting for a GPU | build | setup | judging | reference run ahead | "
        "accepted |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for path in paths:
        lines = read_results(path)
        total = sum(float(d.get("elapsed_s") or 0) for d in lines)
        recs = [d.get("record") or {} for d in lines]
        wait = sum(float(r.get("gpu_wait_s") or 0) for r in recs)
        build, setup = (
            sum(float((r.get("stage_seconds") or {}).get(k, 0)) for r in recs) for k in ("build", "setup and baselines")
        )
        ahead = sum(any(k.endswith(AHEAD) for k in r.get("stage_detail") or {}) for r in recs)
        share = lambda x: f"{x:,.0f} s ({100 * x / max(total, 1e-9):.0f}%)"
        out.append(
            f"| {path.name} | {len(lines)} | {total:,.0f} | {share(wait)} | {share(build)} | {share(setup)} | "
            f"{share(total - wait - build - setup)} | {ahead} | {sum(bool(d.get('ok')) for d in lines)} |"
        )
    return "\n".join(out)


def compare(before: Path, after: Path) -> str:
    """The jobs whose verdict differs between two runs of the same job file (matched by job key), by cause."""
    from kp.batch.jobfile import read_results

    a = {d["key"]: d for d in read_results(before)}
    b = {d["key"]: d for d in read_results(after)}
    both = sorted(set(a) & set(b), key=lambda k: a[k]["job"]["name"])
    moved = [k for k in both if cause(a[k]) != cause(b[k]) or a[k]["ok"] != b[k]["ok"]]
    out = [f"{len(both)} jobs in both runs ({len(a)} and {len(b)} recorded); {len(moved)} changed cause:"]
    for k in moved:
        out.append(
            f"- {a[k]['job']['name']}: {cause(a[k])} -> {cause(b[k])}\n"
            f"    before: {a[k]['verdict'][:220]}\n    after:  {b[k]['verdict'][:220]}"
        )
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("refs")
    a.add_argument("folder", type=Path)
    a.add_argument("--out", type=Path, required=True)
    a.add_argument("--device", default="cpu")
    a.add_argument("--procs", type=int, default=2)
    a.add_argument("--timeout", type=float, default=900)
    a.add_argument("--precision", default="fp32", help="fp32, tf32, bf16 or fp16 (run.py's --precision)")
    a.add_argument("--every", type=int, default=1, help="keep every N-th file")
    b = sub.add_parser("jobs")
    b.add_argument("root", type=Path)
    b.add_argument("--csv", type=Path, required=True)
    b.add_argument("--every", type=int, default=1, help="keep every N-th pair")
    b.add_argument("--count", type=int, default=None, help="keep N pairs, evenly spread")
    b.add_argument("--modes", default="", help="e.g. train,eval: a row per pair and mode")
    w = sub.add_parser("warm")
    w.add_argument("csv", type=Path)
    w.add_argument("--procs", type=int, default=8)
    w.add_argument("--timeout", type=float, default=300)
    w.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    c = sub.add_parser("classify")
    c.add_argument("results", type=Path)
    c.add_argument("--md", action="store_true")
    f = sub.add_parser("floors")
    f.add_argument("results", type=Path)
    p = sub.add_parser("pace")
    p.add_argument("results", type=Path, nargs="+")
    d = sub.add_parser("compare")
    d.add_argument("before", type=Path)
    d.add_argument("after", type=Path)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    if args.cmd == "refs":
        judge_refs(args.folder, args.out, args.device, args.procs, args.timeout, args.precision, args.every)
    elif args.cmd == "warm":
        warm(args.csv, args.procs, args.timeout, args.device)
    elif args.cmd == "jobs":
        modes = tuple(m for m in args.modes.split(",") if m)
        print(f"{leaderboard_jobs(args.root, args.csv, args.every, modes, args.count)} jobs written to {args.csv}")
    elif args.cmd == "floors":
        print(floors(args.results))
    elif args.cmd == "pace":
        print(pace(args.results))
    elif args.cmd == "compare":
        print(compare(args.before, args.after))
    else:
        print(classify(args.results, args.md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
