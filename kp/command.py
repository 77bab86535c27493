"""The command line's machinery (run.py is its thin shell): the parser, what each flag runs, the judge's options from
the command line, and the warm judge's slot, which runs command lines as run.py does. Nothing here imports torch
at its top: `--help` and a box started early come before torch's import (run.py)."""

import argparse
import json
import os
import sys
import time
from pathlib import Path

USAGE = """Judge kernels against any KernelBench-format reference: parity against float64, then eager / torch.compile /
the kernels timed side by side against the ceilings measured in the same run.

  python run.py --problem softmax                      a built-in problem: its ladder of variants on this GPU
  python run.py --problem softmax --variant all        ... and the rungs kept as records of designs that lost
  python run.py --ref path/to/19_ReLU.py               any KernelBench file: eager vs torch.compile vs the ceiling
  python run.py --ref path/to/19_ReLU.py --candidate my_relu.py
  python run.py --problem softmax --candidate my_softmax.py
                                                       judge a file defining ModelNew in its own process:
                                                       exit 0 accepted, 1 rejected (reason on one line)
  python run.py --list                                 problems, their variants and what each needs
  python run.py --build                                build every kernel in parallel (first use does this lazily);
                                                       without a GPU: compile-check every rung with nvcc

Without a GPU (parity only: nothing is timed, and whether a kernel of its own runs is not checked):
  python run.py --ref path/to/19_ReLU.py --candidate my_relu.py --device cpu --allow-torch
  python run.py --problem softmax --device cpu --at test
                                                       the reference's own Model against its float64 copy, at
                                                       the problem's small test shape (at its benchmark shape:
                                                       minutes and many GB of host memory)

Many at once (one job = one reference and one candidate, or a problem's ladder; --slots jobs a GPU at a time):
  python run.py --ref ref.py --candidate cands/*.py --gpus all --out results.jsonl
  python run.py --problem all --gpus all               every built-in problem, spread over the GPUs
  python run.py --jobs jobs.csv --gpus 0,1 --out results.jsonl    CSV header: reference,candidate
  python run.py --jobs jobs.csv --ray auto --out results.jsonl     the same jobs as Ray tasks (pip install ray)
  Each finished job is one line of --out at once; re-running skips the jobs already there (same file contents).

Exit codes: 0 accepted, 1 a row or the candidate rejected (or a kernel that does not compile), 2 no verdict: a usage
error (unknown problem/variant, no CUDA device, a reference file without the KernelBench contract), too little GPU
memory, too few calls checkable here for an acceptance, or a GPU kernel (or a request for CUDA) on a CPU host;
130 / 143 stopped by Ctrl-C / SIGTERM. Many jobs: 1 if one was rejected, else 2 if one got no verdict, else 0. The
record (--json, each --out line) says the same as data: status accepted / rejected / no_verdict, and a rejection's
failure (kind, stage, check, figures); kp/record.schema.json describes it.
"""


def parse_args(argv):
    prog = "kp" if Path(sys.argv[0]).name == "kp" else "run.py"  # the installed command, or the file
    ap = argparse.ArgumentParser(prog=prog, description=USAGE, formatter_class=argparse.RawDescriptionHelpFormatter)
    _what_to_judge(ap.add_argument_group("what to judge: a problem, a reference and its candidates, or many jobs"))
    _many_jobs(ap.add_argument_group("many jobs: where they run and what is kept"))
    _how_to_judge(ap.add_argument_group("how it is judged: semantics, inputs, shapes, precision and device"))
    _what_runs(ap.add_argument_group("what runs: baselines, the box and pure PyTorch"))
    _warm_judge(ap.add_argument_group("a judge kept warm between commands"))
    _what_is_shown(ap.add_argument_group("what is written and shown besides the verdict"))
    return ap.parse_args(argv)


def _what_to_judge(g) -> None:
    src = g.add_mutually_exclusive_group()
    src.add_argument("--problem", action="append", help="built-in problem id (repeatable), or all")
    src.add_argument(
        "--ref", metavar="FILE", help="a KernelBench-format reference file (Model, get_inputs, get_init_inputs)"
    )
    src.add_argument("--jobs", metavar="CSV", help="(reference, candidate) pairs to judge, one per line")
    g.add_argument(
        "--candidate",
        metavar="FILE",
        nargs="+",
        help="judge this ModelNew file (in its own process); several: one job each",
    )
    g.add_argument(
        "--variant",
        action="append",
        help="variant(s) of a built-in problem (default: the ladder that "
        "runs on this GPU, and auto where the model has one; 'all' "
        "adds the records)",
    )
    g.add_argument("--list", action="store_true", help="list problems and variants")
    g.add_argument("--build", action="store_true", help="build kernels in parallel and exit")
    g.add_argument(
        "--build-jobs",
        type=int,
        default=None,
        help="parallel builds for --build, and for many jobs "
        "the candidates' own extensions built at once "
        "ahead of judging (default: one per CPU core)",
    )


def _many_jobs(g) -> None:
    g.add_argument(
        "--gpus",
        metavar="SPEC",
        help="judge jobs on these GPUs of this host: all, 0,1 or a count "
        "(default with many jobs: 1, the first GPU); a GPU named more "
        "than once (0,0,1,1) gets that many slots",
    )
    g.add_argument(
        "--slots",
        metavar="N",
        help="slots (jobs at a time) on each GPU of --gpus, or with --device cpu "
        "on the CPU: a number, or auto (the default: 3 a GPU where the host "
        "has 5 cores for each; 1 on the CPU)",
    )
    g.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="judge jobs as Ray tasks of one GPU each: auto (a running cluster), an address, or local (start one here)",
    )
    g.add_argument(
        "--out",
        metavar="JSONL",
        help="append each finished job's record here; a re-run skips the jobs already recorded",
    )
    g.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds a candidate's job may take, single run or "
        "batch, before it is rejected naming the stage it "
        "was in (default 600)",
    )


def _how_to_judge(g) -> None:
    g.add_argument(
        "--mode",
        default="train",
        choices=["train", "eval"],
        help="train (default: a fresh Model trains, KernelBench's contract) or eval (inference "
        "semantics: both models in eval mode, calls under no_grad, weights still changed)",
    )
    g.add_argument(
        "--backward",
        action="store_true",
        help="judge the gradients too: every parity call also runs a backward pass from a fresh upstream "
        "gradient, and every floating input's and trained parameter's gradient is compared with "
        "the reference's in float64 (docs/judge.md, 'Gradients')",
    )
    g.add_argument("--seed", type=int, default=None, help="input seed (default: from the OS, printed)")
    g.add_argument(
        "--trials", type=int, default=3, help="parity calls on fresh benchmark-shape inputs (>= 3; default 3)"
    )
    g.add_argument(
        "--shapes",
        default="0",
        metavar="N|MEMBERS",
        help="also judge at N other shapes of the reference's family (its module-level sizes: those "
        "its SHAPE_FAMILY declares, then odd, half, one, double, odd-half, odd-double), or at the "
        "members named ('odd,double'); a candidate right at the benchmark's shape only is rejected; "
        "with timing, each shape is timed too (a table row per shape; --plot draws the curve) "
        "(default 0: KernelBench's contract, one shape)",
    )
    g.add_argument(
        "--at",
        default=None,
        metavar="SIZES|MEMBER",
        help="judge at this shape in place of the benchmark's: sizes of the reference's family by name "
        "('batch_size=64,dim=8192'), the sizes the file declares for quick checks (test: its "
        "TEST_SIZES) or a member (half, odd, ...); every stage runs there, timing included, and the "
        "verdict and the record say so (default: the benchmark's shape, KernelBench's contract)",
    )
    g.add_argument(
        "--precision",
        default="fp32",
        help="fp32 (default; TF32 off); tf32 (opt-in: budget from "
        "PyTorch with TF32 on, baselines timed with it on, the "
        "TF32 GEMM ceiling); bf16 or fp16 (every floating input, "
        "weight and buffer cast, the output judged in that dtype "
        "against float64, the budget from PyTorch in that dtype, "
        "the 16-bit GEMM ceiling)",
    )
    g.add_argument(
        "--device",
        default=None,
        help="cuda (default) or cpu (parity only, for pure-torch candidates; no timing, escape or own-kernel checks)",
    )


def _what_runs(g) -> None:
    g.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    g.add_argument("--no-bench", action="store_true", help="parity and a short timed check only; no table")
    g.add_argument(
        "--no-sandbox",
        action="store_true",
        help="run candidates without the sandbox (bubblewrap namespaces and limits; on by default where bwrap works)",
    )
    g.add_argument(
        "--allow-torch",
        action="store_true",
        help="accept a candidate that runs no kernel of its own: a pure-PyTorch rewrite, or one over an installed "
        "library's kernels (Triton, CUDA or CuPy code of a package, not of the candidate's folder); the row says "
        "which, the library's kernels named by package",
    )
    g.add_argument(
        "--sanitize",
        action="store_true",
        help="once a candidate passed, run its call under compute-sanitizer (memcheck, initcheck, racecheck, "
        "synccheck), each tool in a box of its own, and once with every SM's shared memory filled, at the smallest "
        "shape judged; a hazard in a kernel of its own rejects it (memory_error, race). GPU only; adds 10-40 s",
    )


def _warm_judge(g) -> None:
    g.add_argument(
        "--warm",
        action="store_true",
        help="judge in a judge kept warm between commands (started by the first such command, ended "
        "after 15 idle minutes; also KP_WARM=1): the next command on the same candidate file pays "
        "neither torch's import nor its box's start",
    )
    g.add_argument("--warm-stop", action="store_true", help="end this user's warm judges")
    g.add_argument("--warm-serve", help=argparse.SUPPRESS)


def _what_is_shown(g) -> None:
    g.add_argument("--json", metavar="PATH", help="write the full record as JSON")
    g.add_argument(
        "--probes",
        action="store_true",
        help="print the reference's probes: outputs no kernel computes "
        "(zeros, a constant, an input passed through, the call before's output, the reference in bf16 "
        "and fp16), each judged at the benchmark shape's calls as a candidate is (they always run; the "
        "record's `probes`)",
    )
    g.add_argument(
        "--profile",
        action="store_true",
        help="one call of each row under PyTorch's profiler: its kernels with count, GPU time and share of the call",
    )
    g.add_argument(
        "--ncu",
        action="store_true",
        help="one call of each row under Nsight Compute (ncu, when it "
        "exists): per kernel DRAM bytes, bandwidth, SM and tensor "
        "throughput, registers, local memory, occupancy",
    )
    g.add_argument(
        "--plot",
        metavar="PNG",
        help="draw the timing table as a roofline picture, or with --shapes the "
        "speed curve over the shapes (the roofline beside it, -roofline) "
        "(needs matplotlib); several problems: one file each, -PROBLEM",
    )


def many_jobs(args) -> bool:
    """Whether the command judges many jobs (each its own judge in a slot) rather than one here."""
    return bool(args.jobs or args.gpus or args.ray or args.out or (args.candidate and len(args.candidate) > 1))


def quiet_args(argv):
    """The command line parsed without a word, or None on --help or a usage error (said once, by main())."""
    import contextlib
    import io

    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            return parse_args(argv)
    except SystemExit:
        return None


def start_box_early(argv, later: bool = False, one_waiting: bool = False) -> None:
    """One candidate judged in a box: start the box now, before torch is imported here, so that its own start-up
    runs while this process gets ready (kp.box.start; the judge adopts it, or starts another if the job differs).
    later: kept for a later command on the same candidate (a warm judge's, kp.batch.server); one_waiting: unless
    one for it waits already (the others go)."""
    args = quiet_args(argv)
    if (
        args is None
        or many_jobs(args)
        or args.list
        or args.build
        or not args.candidate
        or (args.problem and len(args.problem) != 1)
    ):
        return
    spec = ("file", args.ref) if args.ref else ("problem", args.problem[0]) if args.problem else None
    if spec and spec[1] != "all":
        from kp.box import start as boxstart

        boxstart.start_early(
            spec,
            args.candidate[0],
            boxed=not args.no_sandbox,
            later=later,
            cuda=args.device != "cpu",
            one_waiting=one_waiting,
        )


def warm_fits(argv) -> bool:
    """Whether a warm judge (--warm) runs this command: one judgement (a batch has slots of its own), not --list,
    --build or a usage error (said here, by main())."""
    args = quiet_args(argv)
    return (
        args is not None
        and not (many_jobs(args) or args.list or args.build or args.warm_stop)
        and bool(args.ref or args.problem)
    )


def fail_usage(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def list_problems() -> None:
    """Every problem's rungs: what each needs, whether it runs here, which are records, which is the default."""
    import harness

    cap = harness.capability()
    print("GPU: " + (f"compute capability {cap[0]}.{cap[1]}" if cap else "none (rungs are listed, none runs here)"))
    for p in harness.problems():
        mod = harness.problem_module(p)
        d = getattr(mod, "DEFAULT_VARIANT", None)
        prefs = list(d) if isinstance(d, (tuple, list)) else [d]  # the default, then its fallbacks
        items = []
        for v in harness.variants(p):
            r = harness.rung(p, v)
            tags = [r.requires] + (["record"] if r.record else [])
            tags += ["default" if prefs.index(v) == 0 else f"default where {prefs[0]} cannot run"] if v in prefs else []
            tags += [] if r.runs_on(cap) or cap is None else ["not on this GPU"]
            items.append(f"{v} ({', '.join(tags)})")
        if d == "auto":
            items.append("auto (default: picks a rung per call)")
        print(f"{p}: {', '.join(items)}")


def expand_variants(problem: str, asked: list[str] | None, precision: str | None = "fp32") -> list[str]:
    """The rows asked for: none -> the ladder this GPU runs in this precision (and auto); 'all' -> with the records
    (precision None: every rung, as --build takes them). An unknown name, or a rung this GPU cannot run or that does
    not take the precision, is a UsageError in one line."""
    import harness
    from kp.judge import driver as judge

    if not asked:
        return judge.default_variants(problem, precision=precision)
    out = []
    for v in asked:
        if v == "all":
            out += judge.default_variants(problem, include_records=True, precision=precision)
        elif v == "auto" and harness.picks_per_call(problem):
            out.append(v)
        else:
            r = harness.rung(problem, v)  # unknown: the list of variants
            if not r.runs_on(harness.capability()) and harness.capability() is not None:
                raise harness.UsageError(r.why_not(harness.capability()))
            if precision is not None and precision not in r.precisions:
                raise harness.UsageError(
                    f"{problem}/{v} takes {', '.join(r.precisions)}, not {precision} (its Precisions line)"
                )
            out.append(v)
    return list(dict.fromkeys(out))


def main(argv=None) -> int:
    import harness  # here, not at the top: --help and a usage error answer before torch is imported

    args = parse_args(argv)
    if args.list:
        list_problems()
        return 0
    if args.problem and "all" in args.problem:
        args.problem = harness.problems()
    batch = many_jobs(args)
    wrong = usage_error(args, batch)
    if wrong:
        return fail_usage(wrong)
    if args.plot:
        from kp.observe import plot  # matplotlib's import, only where a picture is asked for

        plot.require()
    import torch  # after the usage checks: a mistyped flag is answered without torch's import

    if args.build and (args.device == "cpu" or not torch.cuda.is_available()):
        return compile_check(args)
    if args.device is None and not torch.cuda.is_available() and not args.ray:
        return fail_usage(
            "no CUDA device visible (torch.cuda.is_available() is False): the kernels need an "
            "NVIDIA GPU; --device cpu runs the parity checks of a pure-torch candidate"
        )
    if args.build:
        return build_kernels(args)
    opts = judge_opts(args)
    if args.json:  # its folder made now, before the judging, never a traceback after the verdict
        try:
            Path(args.json).resolve().parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            return fail_usage(f"--json {args.json}: its folder cannot be made ({e.strerror or e})")
    if batch:
        from kp.batch.backends import run_batch  # the batch's modules, only for many jobs

        return run_batch(args, opts)
    return judge_here(args, opts)


def usage_error(args, batch: bool) -> str | None:
    """What is wrong with the command line as a whole (flags that do not go together, a problem or mode that does
    not exist), before anything is imported or judged; None where nothing is."""
    import harness

    if args.precision not in harness.PRECISIONS:
        return f"--precision must be one of {', '.join(harness.PRECISIONS)}, got {args.precision!r}"
    if args.build_jobs is not None and args.build_jobs < 1:
        return f"--build-jobs: builds at once, at least 1, got {args.build_jobs}"
    for p in args.problem or []:
        if p not in harness.problems():
            return f"unknown problem {p!r}; problems: {', '.join(harness.problems())}"
        modes = getattr(harness.problem_module(p), "PRECISIONS", ("fp32",))
        if not args.candidate and args.precision not in modes:
            return f"{p} has no {args.precision!r} mode; it runs in {', '.join(modes)}"
        expand_variants(p, args.variant, args.precision)
    if not args.problem and not args.ref and not args.build and not args.jobs:
        return "give --problem ID or --ref FILE (or --jobs CSV, --list, --build); problems: " + ", ".join(
            harness.problems()
        )
    if args.candidate and (args.variant or args.build or args.jobs or (args.problem and len(args.problem) != 1)):
        return "--candidate takes one --problem or --ref, and no --variant/--build/--jobs"
    if batch and (args.variant or args.build or args.json):
        return (
            "many jobs (--gpus/--ray/--out/--jobs or several candidates) take no --variant, --build "
            "or --json: each job's full record goes to --out"
        )
    if args.gpus and args.ray:
        return "--gpus (this host) or --ray (a cluster), not both"
    if args.slots and (args.ray or not batch):
        return (
            "--slots: the slots (jobs at a time) of a batch on this host: on each GPU of --gpus, or "
            "with --device cpu on the CPU; several candidates, --jobs or --out make a batch"
        )
    if args.plot and batch:
        return "--plot draws one run's table; many jobs write their records to --out"
    if args.ref and (args.variant or args.build):
        return "--variant and --build belong to built-in problems, not to --ref files"
    if args.variant and args.device == "cpu" and not args.build:
        return (
            "--variant runs the playground's kernels, which need a GPU; on the CPU --problem judges the "
            "reference's own Model, and --candidate a pure-PyTorch ModelNew"
        )
    return None


def build_kernels(args) -> int:
    """--build: the kernels of the problems asked for (every problem's by default), built at once."""
    import harness

    probs = args.problem or harness.problems()
    items = [
        (p, v) for p in probs for v in expand_variants(p, args.variant or ["all"], None) if v in harness.variants(p)
    ]
    t0 = time.perf_counter()
    res = harness.build_all(args.build_jobs, items)
    bad = [r for r in res if r[3]]
    for p, v, _, err in bad:
        print(err, file=sys.stderr)
    print(f"built {len(res) - len(bad)}/{len(res)} kernels in {time.perf_counter() - t0:.1f} s wall")
    return 1 if bad else 0


def judge_here(args, opts) -> int:
    """One job at a time in this process: each problem's ladder, or the reference and its one candidate; its table,
    its verdict, its probes and picture where asked, and --json's record."""
    from kp.judge import driver as judge  # the judge's modules (torch among them), only where something is judged
    from kp.observe import report, verdict

    refs = (
        [judge.Reference.load(("file", args.ref))]
        if args.ref
        else [judge.Reference.load(("problem", p)) for p in args.problem]
    )
    records, status = [], 0
    for ref in refs:
        variants = None
        if ref.problem and not args.candidate and args.device != "cpu":
            variants = expand_variants(ref.problem, args.variant, args.precision)
        elif ref.problem and not args.candidate:  # every problem alike on the CPU: its own Model, no kernels
            print(
                f"{ref.problem}: the playground's kernels run on a GPU; on the CPU the reference's own Model is "
                f"judged against its float64 copy",
                file=sys.stderr,
            )
        rec = judge.judge_job(ref, args.candidate[0] if args.candidate else None, opts, variants)
        records.append(rec)
        print(report.format_record(rec, verdict_follows=bool(args.candidate)), flush=True)
        if args.probes:
            print("\n".join(report.probes_lines(rec)), flush=True)
        if args.candidate:
            print("\n".join(verdict.verdict_lines(rec)), flush=True)
        status = max(status, 0 if rec["ok"] else 1)
        if args.plot:
            from kp.observe import plot  # matplotlib's import, only where a picture is asked for

            path = Path(args.plot)
            if len(refs) > 1:
                path = path.with_name(f"{path.stem}-{ref.name}{path.suffix}")
            print(plot.draw(rec, path), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records[0] if len(records) == 1 else records, f, indent=2, default=str)
    return status


def judge_opts(args):
    """The judge's options from the command line (kp.judge.options.JudgeOptions, its defaults where a flag is not
    given): what one run, a batch's jobs and the tests' batches of judge cases (tests/batched.py) all judge with."""
    from kp.judge.members import parse_shapes
    from kp.judge.options import JudgeOptions

    timeout = {} if args.timeout is None else {"timeout_s": args.timeout}
    return JudgeOptions(
        seed=args.seed,
        trials=args.trials,
        precision=args.precision,
        device=args.device,
        bench=not args.no_bench,
        compile_baseline=not args.no_compile,
        allow_torch=args.allow_torch,
        sandbox=not args.no_sandbox,
        profile=args.profile,
        ncu=args.ncu,
        mode=args.mode,
        shapes=parse_shapes(args.shapes),
        backward=args.backward,
        at=args.at,
        sanitize=args.sanitize,
        **timeout,
    )


def compile_check(args) -> int:
    """--build without a GPU: every rung (or the ones named) compiled by nvcc for each architecture its `Requires`
    line claims, as CI does (kp.lib.checks.check_rungs). Exit 1 if any fails, with the compiler's words."""
    import harness
    import shutil
    from kp.lib.checks import check_rungs

    if shutil.which("nvcc") is None:
        return fail_usage(
            "--build without a GPU compile-checks the kernels with nvcc, and no nvcc is on PATH (the "
            "CUDA toolkit's bin folder)"
        )
    items = []
    for p in args.problem or harness.problems():
        names = harness.variants(p) if not args.variant or "all" in args.variant else args.variant
        items += [harness.rung(p, v) for v in names if v != "auto"]
    return check_rungs(items, args.build_jobs)


def cli(argv=None) -> int:
    """main() as the command line sees it: a usage error, a build error or Ctrl-C is one message on stderr and an
    exit code, never a traceback."""
    import harness
    from kp.errors import stop_signal, stopped_by_signals

    with stopped_by_signals():
        try:
            return main(argv)
        except harness.UsageError as e:
            return fail_usage(str(e))
        except harness.KernelBuildError as e:
            print(f"build error: {e}", file=sys.stderr)
            return 1
        except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: the judge stopped the candidate's worker on its way out
            print("\ninterrupted: no verdict", file=sys.stderr)
            return 128 + stop_signal(e)


def exit_now(code: int) -> None:
    """Leave without the interpreter's teardown of torch, which takes about a second after the verdict is out.
    Every worker, box and temporary file was closed by the judge already; a Ray client keeps the normal exit (its
    shutdown runs at exit)."""
    if "ray" in sys.modules:
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def warm_command(msg: dict, say=None) -> dict:
    """A warm judge's command, in its slot's process: this command line's cli() on it (kp.batch.slot_process)."""
    from kp.batch.slot_process import run_command

    return run_command(msg, cli, start_box_early, say)


def warm_slot_main(*args) -> None:
    """The warm judge's slot process (kp.batch.server starts it): a slot whose command lines run as run.py runs
    them."""
    from kp.batch.slot_process import _slot_main

    _slot_main(*args, command=warm_command)


def entry(argv=None) -> None:
    """The command line as `python run.py` and the installed `kp` command run it: --help before torch's import, the
    warm judge's own process and its stop, a command handed to a warm judge, or the candidate's box started before
    the judge imports torch (in cli()); then the exit, without the interpreter's teardown of torch."""
    import sys
    from kp.lib import bytecode

    argv = sys.argv[1:] if argv is None else list(argv)
    bytecode.enable()  # before torch's import: where the host writes no bytecode, the cache keeps it
    if {"-h", "--help"} & set(argv):  # the usage, without torch's import (seconds) first
        parse_args(argv)
    from kp.batch import server

    if "--warm-serve" in argv:  # the warm judge itself (kp.batch.server), started by a --warm command
        sys.exit(server.serve(*argv[argv.index("--warm-serve") + 1 :][:2], slot_main=warm_slot_main))
    if "--warm-stop" in argv:
        sys.exit(server.stop())
    if server.wanted(argv) and warm_fits(argv):
        code = server.run_warm(argv)
        if code is not None:
            sys.stdout.flush()
            os._exit(code)
    start_box_early(argv)  # the candidate's box starts before the judge imports torch (in cli())
    try:
        exit_now(cli(argv))
    except BrokenPipeError:  # output piped into e.g. `head`, which stopped reading
        sys.stderr.close()
        os._exit(0)
