"""A small workload over every rung of every problem, for compute-sanitizer: the judge's checks on each problem's
declared (small) cases, never the benchmark shapes (the tools slow kernels 10-100x; those would take hours).

  compute-sanitizer --tool memcheck  --error-exitcode 1 python -m tools.sanitize
  compute-sanitizer --tool racecheck --error-exitcode 1 python -m tools.sanitize [--only softmax] [--variant V]

Every output is also checked against float64 by the judge, so a run that 'passes' the tool but computes garbage fails.
"""

import argparse
import sys

import torch

import harness
from kp.judge import driver as judge

ap = argparse.ArgumentParser()
ap.add_argument("--only", default="", help="comma-separated problems (default: all)")
ap.add_argument(
    "--variant", action="append", help="rung(s) to run (default: every rung this GPU runs, and the default)"
)
args = ap.parse_args()
only = set(filter(None, args.only.split(",")))

failures = []
for p in harness.problems():
    if only and p not in only:
        continue
    j = judge.Judge(judge.Reference.load(("problem", p)), seed=0, bench=False)
    j.add_variants(judge.row_specs(j.ref, args.variant or judge.default_variants(p, include_records=True), j.precision))
    for row in j.run_cases():
        print(f"{p}/{row.label}: {'ok' if row.accepted else 'FAIL ' + row.reason}", flush=True)
        if not row.accepted:
            failures.append(f"{p}/{row.label}")
torch.cuda.synchronize()
print(f"sanitize workload: {len(failures)} numerical failures", flush=True)
sys.exit(1 if failures else 0)
