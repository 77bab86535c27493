"""Time to verdict: how long the judge takes, end to end, on a fixed set of references and candidates.

    python -m bench.judge.time_to_verdict                 every case this machine can run (GPU cases need one)
    python -m bench.judge.time_to_verdict --device cpu    the small cases, parity only (what a CPU can judge)
    python -m bench.judge.time_to_verdict --only relu     cases whose name contains 'relu'
    python -m bench.judge.time_to_verdict --batch 8       each case's candidate 8 times in one batch: a job's own
                                                          seconds in a warm slot (its box started ahead)
    python -m bench.judge.time_to_verdict --warm-judge    each command with run.py --warm: a judge kept warm
                                                          between commands (its first, untimed run starts it)
    python -m bench.judge.time_to_verdict --warm-judge --edited    and each command's candidate edited since the
                                                          last (one file, new contents each time): a loop's pace
    python -m bench.judge.time_to_verdict --warm-judge --edited --pause 5    and 5 s between commands, untimed
                                                          (a loop writing its next candidate meanwhile)

Each case is one `run.py --ref ... --candidate ... --no-compile` command in a process of its own, one at a time
(a candidate's own build cached: each case is run once untimed first with --warm), as a user or a search loop would
run it; the wall time is the command's, the stage seconds the record's (`stage_seconds`), with the process's seconds
before the judge started (interpreter, imports, a box's start) and after its verdict (output, teardown). Prints a
markdown table: the case, what it is, the verdict, the wall seconds and where they went. Not a test: nothing is
asserted.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CASES_DIR = ROOT / "bench" / "judge" / "cases"
JUDGE_CASES = ROOT / "tests" / "judge_cases"
SMALL = ROOT / "tests" / "batch"  # the batch tests' (64, 1000) ReLU, its right and its wrong candidate

# name, what it is, reference (a file, or "problem:ID"), candidate, extra flags, runs on the CPU
CASES = [
    ("relu_small", "elementwise 64x1000, torch", SMALL / "ref.py", SMALL / "good.py", ["--allow-torch"], True),
    (
        "relu_small_wrong",
        "elementwise 64x1000, wrong at call 1",
        SMALL / "ref.py",
        SMALL / "wrong.py",
        ["--allow-torch"],
        True,
    ),
    (
        "relu_kernel",
        "elementwise 2048x4099, own kernel",
        JUDGE_CASES / "relu" / "ref.py",
        JUDGE_CASES / "relu" / "kernel.py",
        [],
        False,
    ),
    (
        "sum_dim",
        "reduction, torch",
        JUDGE_CASES / "sum_dim" / "ref.py",
        JUDGE_CASES / "sum_dim" / "torch_rewrite.py",
        ["--allow-torch"],
        True,
    ),
    (
        "layernorm_kernel",
        "norm with weights, own kernel",
        JUDGE_CASES / "layernorm" / "ref.py",
        JUDGE_CASES / "layernorm" / "kernel.py",
        [],
        False,
    ),
    (
        "layernorm_torch",
        "norm with weights, torch",
        JUDGE_CASES / "layernorm" / "ref.py",
        JUDGE_CASES / "layernorm" / "torch_rewrite.py",
        ["--allow-torch"],
        True,
    ),
    (
        "conv_relu_kernel",
        "conv + bias + ReLU, own epilogue",
        JUDGE_CASES / "conv_relu" / "ref.py",
        JUDGE_CASES / "conv_relu" / "kernel.py",
        [],
        False,
    ),
    (
        "gelu_6.4GB",
        "GELU 4096x393216, torch",
        CASES_DIR / "gelu_big" / "ref.py",
        CASES_DIR / "gelu_big" / "torch_rewrite.py",
        ["--allow-torch"],
        False,
    ),
    (
        "gelu_6.4GB_wrong",
        "GELU 4096x393216, wrong at call 1",
        CASES_DIR / "gelu_big" / "ref.py",
        CASES_DIR / "gelu_big" / "wrong_tanh.py",
        ["--allow-torch"],
        False,
    ),
    ("softmax_6.4GB", "built-in softmax 4096x393216, shipped rung", "problem:softmax", "shipped:softmax", [], False),
    (
        "argmax_8.6GB",
        "argmax 128x4096x4095, torch",
        CASES_DIR / "argmax_big" / "ref.py",
        CASES_DIR / "argmax_big" / "torch_rewrite.py",
        ["--allow-torch"],
        False,
    ),
]


def command(ref, cand, flags, device: str | None, json_path: Path, tmp: Path) -> list[str]:
    argv = [sys.executable, str(ROOT / "run.py")]
    if str(ref).startswith("problem:"):
        argv += ["--problem", str(ref).split(":", 1)[1]]
    else:
        argv += ["--ref", str(ref)]
    if str(cand).startswith("shipped:"):  # a shipped model as a candidate file outside the repo
        problem = str(cand).split(":", 1)[1]
        cand = tmp / f"shipped_{problem}.py"
        cand.write_text(f"from models.{problem} import ModelNew as _Shipped\n\n\nclass ModelNew(_Shipped):\n    pass\n")
    argv += ["--candidate", str(cand), "--no-compile", "--json", str(json_path), *flags]
    return argv + (["--device", device] if device else [])


def run_case(
    case, device: str | None, tmp: Path, timeout: float, warm_judge: bool = False, edit: int | None = None
) -> dict:
    """One command for the case. edit: the candidate is a copy of the case's, rewritten before this command with
    this number in a comment (new contents in the same file, as a loop editing its candidate writes it)."""
    name, what, ref, cand, flags, _ = case
    if edit is not None and not str(cand).startswith("shipped:"):
        src = Path(cand)
        cand = tmp / "edited" / src.name
        cand.parent.mkdir(exist_ok=True)
        cand.write_text(src.read_text() + f"\n# edit {edit}\n")
    flags = [*flags, "--warm"] if warm_judge else flags
    out = tmp / f"{name}.json"
    out.unlink(missing_ok=True)
    t0 = time.perf_counter()
    try:
        r = subprocess.run(
            command(ref, cand, flags, device, out, tmp), capture_output=True, text=True, timeout=timeout, cwd=tmp
        )
        lines = r.stdout.strip().splitlines()
        verdict = lines[-1] if lines else (r.stderr.strip().splitlines() or ["no output"])[-1]
    except subprocess.TimeoutExpired:
        verdict = f"did not finish in {timeout:.0f} s"
    wall = time.perf_counter() - t0
    rec = json.loads(out.read_text()) if out.exists() else {}
    stages = dict(rec.get("stage_seconds", {}))
    if warm_judge and "elapsed_s" in rec:  # the judge ran in the warm judge's process: the rest is the command's
        stages = {"the command around the warm judge": wall - rec["elapsed_s"], **stages}
    elif "process_s_before_judge" in rec and "elapsed_s" in rec:  # the command's wall time around the judge's own
        stages = {
            "before the judge": rec["process_s_before_judge"],
            **stages,
            "after the verdict": wall - rec["process_s_before_judge"] - rec["elapsed_s"],
        }
    return {
        "case": name,
        "what": what,
        "verdict": verdict,
        "status": rec.get("status"),
        "wall_s": round(wall, 2),
        "stages": stages,
        "detail": rec.get("stage_detail", {}),
        "box_ahead": rec.get("boxes_started_ahead"),
        "box_missed": rec.get("boxes_passed_over", []),
    }


def run_batch_case(case, n: int, slots: int, device: str | None, tmp: Path, timeout: float) -> dict:
    """The case's candidate judged n times in one batch (n copies of the file, `slots` slots on GPU 0, or on the
    CPU), as a search loop submits its candidates: each job's own seconds from the results file (its slot warm, its
    box started while the job before ran), the median of all but each slot's first job."""
    name, what, ref, cand, flags, _ = case
    argv = command(ref, cand, flags, device, tmp / "unused.json", tmp)
    cand_path = Path(argv[argv.index("--candidate") + 1])
    copies = []
    for i in range(n):  # n different files (a batch judges a file's contents once), each in a copy of its folder
        d = tmp / f"{name}_batch" / f"copy_{i:03d}"
        if cand_path.parent == tmp:  # a shipped model's one-line file, written here
            d.mkdir(parents=True, exist_ok=True)
        else:
            shutil.copytree(cand_path.parent, d, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
        c = d / cand_path.name
        c.write_text(cand_path.read_text() + f"\n# copy {i}\n")
        copies.append(str(c))
    out = tmp / f"{name}_batch.jsonl"
    out.unlink(missing_ok=True)
    i = argv.index("--candidate")
    argv = argv[: i + 1] + copies + argv[i + 2 :]
    argv = [a for a in argv if a not in ("--json", str(tmp / "unused.json"))]
    argv += ["--out", str(out)] + (["--gpus", ",".join(["0"] * slots)] if device != "cpu" else [])
    t0 = time.perf_counter()
    try:
        subprocess.run(argv, capture_output=True, text=True, timeout=timeout * n, cwd=tmp)
    except subprocess.TimeoutExpired:
        pass
    wall = time.perf_counter() - t0
    lines = [json.loads(ln) for ln in out.read_text().splitlines()] if out.exists() else []
    if not lines:
        return {"case": name, "what": what, "verdict": "no result", "wall_s": round(wall, 2), "stages": {}}
    lines.sort(key=lambda d: d.get("finished_at", ""))
    warm = lines[slots:] or lines
    walls = sorted(float(d["elapsed_s"]) for d in warm)
    mid = min(warm, key=lambda d: abs(float(d["elapsed_s"]) - walls[len(walls) // 2]))
    rec = mid.get("record") or {}
    statuses = {d["status"] for d in lines}
    return {
        "case": f"{name} x{n}",
        "what": f"{what}; batch of {n} on {slots} slot(s)",
        "verdict": " / ".join(sorted(statuses)),
        "status": next(iter(statuses)) if len(statuses) == 1 else None,
        "wall_s": walls[len(walls) // 2],
        "walls": walls,
        "batch_wall_s": round(wall, 1),
        "per_hour": round(len(lines) / wall * 3600),
        "stages": dict(rec.get("stage_seconds", {})),
        "detail": rec.get("stage_detail", {}),
    }


def table(rows: list[dict]) -> str:
    out = [
        "| case | what | verdict | wall s (range) | box started ahead | stages (s) | inside them, largest first (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        v = "accepted" if r.get("status") == "accepted" else r["verdict"][:90]  # an acceptance's notes left out
        st = ", ".join(f"{k} {v:.1f}" for k, v in r["stages"].items())
        dt = ", ".join(f"{k} {v:.1f}" for k, v in list(r.get("detail", {}).items())[:5])
        ahead = r.get("box_ahead")  # whether the candidate's worker came from the box the command started early
        ahead = "-" if not ahead else ", ".join("yes" if a else "no" for a in ahead)
        if r.get("box_missed"):  # why the box started early did not serve (kp.box.start.passed_over)
            ahead += " (" + "; ".join(r["box_missed"]) + ")"
        walls = r.get("walls") or []
        wall = f"{r['wall_s']:.1f}" + (f" ({min(walls):.1f}-{max(walls):.1f})" if len(walls) > 1 else "")
        out.append(f"| {r['case']} | {r['what']} | {v} | {wall} | {ahead} | {st} | {dt} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None, help="cpu: the small cases, parity only")
    ap.add_argument("--only", default="", help="cases whose name contains this")
    ap.add_argument("--warm", action="store_true", help="run each case once untimed first (builds cached)")
    ap.add_argument("--repeat", type=int, default=1, help="timed runs per case (the table shows the median)")
    ap.add_argument(
        "--warm-judge",
        action="store_true",
        help="each command with run.py --warm (a judge kept warm between commands); the untimed first "
        "run of each case (--warm) starts it, and it is stopped at the end",
    )
    ap.add_argument(
        "--edited",
        action="store_true",
        help="each command's candidate a new version of the case's file (the same path, new contents)",
    )
    ap.add_argument(
        "--pause",
        type=float,
        default=0.0,
        metavar="S",
        help="seconds between commands, not timed (a loop writing its next candidate meanwhile)",
    )
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", metavar="PATH", help="write every run's figures here")
    ap.add_argument(
        "--batch",
        type=int,
        default=0,
        metavar="N",
        help="judge each case's candidate N times in one batch (warm slots) instead of one command each; "
        "the wall column is a job's own seconds, median of all but each slot's first",
    )
    ap.add_argument("--slots", type=int, default=1, help="with --batch: slots on GPU 0")
    args = ap.parse_args(argv)
    cases = [c for c in CASES if args.only in c[0] and (args.device != "cpu" or c[5])]
    rows = []
    with tempfile.TemporaryDirectory(prefix="kp-judge-bench-") as d:
        tmp = Path(d)
        for case in cases:
            if args.batch:
                rows.append(run_batch_case(case, args.batch, args.slots, args.device, tmp, args.timeout))
                print(
                    table(rows[-1:]).splitlines()[-1] + f" batch wall {rows[-1].get('batch_wall_s')} s, "
                    f"{rows[-1].get('per_hour')} verdicts/h",
                    file=sys.stderr,
                    flush=True,
                )
                if args.json:
                    Path(args.json).write_text(json.dumps(rows, indent=1))
                continue
            edits = iter(range(args.repeat + 1)) if args.edited else None
            if args.warm or args.warm_judge:
                run_case(case, args.device, tmp, args.timeout, args.warm_judge, edits and next(edits))
            runs = []
            for _ in range(args.repeat):
                time.sleep(args.pause)
                runs.append(run_case(case, args.device, tmp, args.timeout, args.warm_judge, edits and next(edits)))
            runs.sort(key=lambda r: r["wall_s"])
            rows.append({**runs[len(runs) // 2], "walls": [r["wall_s"] for r in runs]})
            print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)  # a run cut short keeps its rows
            if args.json:
                Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.warm_judge:
        subprocess.run([sys.executable, str(ROOT / "run.py"), "--warm-stop"], capture_output=True)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
