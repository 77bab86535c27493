#!/usr/bin/env python3
"""Build, check and time the playground's kernels.

  python run.py --problem softmax            parity vs float64, then eager / torch.compile / every variant timed
  python run.py --list                       problems and their variants
  python run.py --build                      build every kernel in parallel (first use does this lazily)
  python run.py --problem softmax --candidate my_kernel.py
                                             judge a KernelBench-format file defining ModelNew (checker.py):
                                             exit 0 accepted, 1 rejected (reason on one line), 2 usage error

Exit codes: 0 ok, 1 parity failure (or candidate rejected), 2 usage error (unknown problem/variant, no CUDA device).
"""
import argparse
import json
import os
import sys
import time

import harness


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problem", action="append", help="problem id (repeatable); default: all with --build")
    ap.add_argument("--variant", action="append", help="variant(s) to run (default: all)")
    ap.add_argument("--list", action="store_true", help="list problems and variants")
    ap.add_argument("--build", action="store_true", help="build kernels in parallel and exit")
    ap.add_argument("--jobs", type=int, default=None, help="parallel builds for --build")
    ap.add_argument("--seed", type=int, default=None, help="input seed (default: from the OS, printed)")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    ap.add_argument("--no-bench", action="store_true", help="parity only")
    ap.add_argument("--json", metavar="PATH", help="write the full record as JSON")
    ap.add_argument("--candidate", metavar="FILE", help="judge this ModelNew file (in its own process) instead of "
                                                        "the playground's variants")
    ap.add_argument("--trials", type=int, default=3, help="--candidate: parity trials on fresh inputs (>= 3)")
    ap.add_argument("--precision", default="fp32", help="fp32 (default; TF32 off) or tf32 (opt-in, for problems "
                                                        "that have the mode and for --candidate: budget from "
                                                        "PyTorch with TF32 on, baselines timed with TF32 on)")
    ap.add_argument("--device", default=None, help="--candidate: cuda (default) or cpu (parity on the declared "
                                                   "cases only, for pure-torch candidates; no timing)")
    return ap.parse_args(argv)


def fail_usage(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.list:
        for p in harness.problems():
            print(f"{p}: {', '.join(harness.variants(p))}")
        return 0
    for p in args.problem or []:
        if p not in harness.problems():
            return fail_usage(f"unknown problem {p!r}; problems: {', '.join(harness.problems())}")
        modes = getattr(harness.problem_module(p), "PRECISIONS", ("fp32",))
        if not args.candidate and args.precision not in modes:
            return fail_usage(f"{p} has no {args.precision!r} mode; it runs in {', '.join(modes)}")
        for v in args.variant or []:
            if v not in harness.variants(p):
                return fail_usage(f"unknown variant {v!r} of {p}; variants: {', '.join(harness.variants(p))}")
    if args.precision not in harness.PRECISIONS:
        return fail_usage(f"--precision must be one of {', '.join(harness.PRECISIONS)}, got {args.precision!r}")
    if not args.problem and not args.build:
        return fail_usage("give --problem ID (or --list / --build); problems: " + ", ".join(harness.problems()))
    if args.candidate:
        return run_candidate(args)
    import torch
    if not torch.cuda.is_available():
        return fail_usage("no CUDA device visible (torch.cuda.is_available() is False): the kernels need an "
                          "NVIDIA GPU; CPU-only checks run under pytest")
    if args.build:
        probs = args.problem or harness.problems()
        items = [(p, v) for p in probs for v in (args.variant or harness.variants(p))]
        t0 = time.perf_counter()
        res = harness.build_all(args.jobs, items)
        bad = [r for r in res if r[3]]
        for p, v, _, err in bad:
            print(err, file=sys.stderr)
        print(f"built {len(res) - len(bad)}/{len(res)} kernels in {time.perf_counter() - t0:.1f} s wall")
        return 1 if bad else 0
    records = []
    status = 0
    for p in args.problem:
        rec = harness.run_problem(p, args.variant or harness.variants(p), seed=args.seed,
                                 compile_baseline=not args.no_compile, bench=not args.no_bench,
                                 precision=args.precision)
        records.append(rec)
        print(harness.format_table(rec), flush=True)
        status = max(status, 0 if rec["parity_ok"] else 1)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=2, default=str)
    return status


def run_candidate(args) -> int:
    if len(args.problem) != 1 or args.variant or args.build:
        return fail_usage("--candidate takes exactly one --problem and no --variant/--build")
    import checker
    rec = checker.evaluate(args.problem[0], args.candidate, seed=args.seed, trials=args.trials,
                           precision=args.precision, device=args.device, bench=not args.no_bench,
                           compile_baseline=not args.no_compile)
    print(checker.format_record(rec), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rec, f, indent=2, default=str)
    return 0 if rec["accepted"] else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except harness.UsageError as e:
        sys.exit(fail_usage(str(e)))
    except harness.KernelBuildError as e:
        print(f"build error: {e}", file=sys.stderr)
        sys.exit(1)
