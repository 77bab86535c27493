"""A search loop's pace through the Python API: N small candidates (source texts, each its own) judged against one
reference by one JudgeSession in this process, the session's start and first call included.

    python -m bench.judge.session_pace                      100 candidates, three slots on GPU 0, parity only
    python -m bench.judge.session_pace --bench --gpus 0     timed too, one slot
    python -m bench.judge.session_pace --device cpu -n 10   on the CPU
    python -m bench.judge.session_pace -n 20 --sequential --pause 3    one call per candidate, each after the
                                                            last verdict and 3 s (a loop writing its next one)

The candidates are the batch tests' (64, 1000) ReLU rewritten in PyTorch, each with a tag of its own (so each is a
file of its own contents), every tenth one wrong (it scales its output by 1.001). Prints the wall seconds, the
verdicts per hour and how many verdicts were right. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REF = ROOT / "tests" / "batch" / "ref.py"
SOURCE = '''"""Candidate {i} of a search loop."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x){wrong}
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=100, help="candidates")
    ap.add_argument("--gpus", default="0,0,0", help="run.py's --gpus for the session's slots")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--bench", action="store_true", help="time each candidate too (default: parity only)")
    ap.add_argument(
        "--sequential",
        action="store_true",
        help="one call per candidate, each after the last verdict (default: one call for all)",
    )
    ap.add_argument(
        "--pause",
        type=float,
        default=0.0,
        metavar="S",
        help="with --sequential: seconds between calls, not counted in the wall time",
    )
    args = ap.parse_args()
    t0 = time.perf_counter()
    from kp.batch.session import JudgeSession

    cpu = args.device == "cpu"
    sources = [SOURCE.format(i=i, wrong=" * 1.001" if i % 10 == 9 else "") for i in range(args.n)]
    with JudgeSession(
        str(REF),
        gpus=None if cpu else args.gpus,
        slots=2 if cpu else 1,
        allow_torch=True,
        bench=args.bench,
        compile_baseline=False,
        device="cpu" if cpu else None,
    ) as judge:
        t_ready = time.perf_counter()
        if args.sequential:
            verdicts, calls = [], []
            for s in sources:
                time.sleep(args.pause)
                t = time.perf_counter()
                verdicts.append(judge(source=s))
                calls.append(time.perf_counter() - t)
        else:
            verdicts = judge.many(sources=sources)
    wall = time.perf_counter() - t0 - (args.pause * len(sources) if args.sequential else 0.0)  # pauses not counted
    right = sum(v["ok"] == (i % 10 != 9) for i, v in enumerate(verdicts))
    print(
        f"{len(verdicts)} candidates in {wall:.1f} s (session ready in {t_ready - t0:.1f} s): "
        f"{len(verdicts) / wall * 3600:.0f} verdicts per hour; {right} of {len(verdicts)} verdicts as expected "
        f"(every tenth candidate wrong); {args.gpus if not cpu else 'cpu'}, "
        f"{'timed' if args.bench else 'parity only'}"
    )
    if args.sequential:
        calls.sort()
        print(
            f"one call per candidate, {args.pause:g} s between calls: median {calls[len(calls) // 2]:.2f} s a call "
            f"(fastest {calls[0]:.2f}, slowest {calls[-1]:.2f} s); boxes started ahead: "
            f"{sum(v['record'].get('boxes_started_ahead') == [True] for v in verdicts if v.get('record'))} of "
            f"{len(verdicts)}"
        )
    for i, v in enumerate(verdicts):
        if v["ok"] != (i % 10 != 9):
            print(f"  candidate {i}: {v['verdict'][:160]}")


if __name__ == "__main__":
    main()
