"""Judge cases judged as a search loop's candidates are: one batch over warm slots (kp.batch), each test looking up
its own result.

A judge case costs a GPU test 15-25 s as a single command (a fresh judge process, its box and CUDA's start every
time) and a warm slot 1-6 s, so the GPU tests judge their cases this way. Each job is judged as `run.py ARGS`
judges it: the same parser and the same options (run.judge_opts), the same job function as `run.py --jobs`; its
result line has the verdict line, whether it is ok, and the judge's full record. The mechanism runs in CI on CPU
slots (test_judge_cases.py, test_batched_cases_keep_each_commands_verdict)."""

from __future__ import annotations

from pathlib import Path

import run
from kp.batch import backends, jobfile
from kp.errors import EXIT_CODES


# The GPU tests served by one batch per pytest process (tests/test_judge_cases.py's gpu_batch fixture): the batch's
# time is theirs together, whichever of them sets it up.
GPU_BATCHED = ("test_judge_case_on_gpu", "test_wrong_case_rejected_on_gpu", "test_sanitize_case_accepted_without_it")

# GPU tests that run on the batch's lane after the batch (tools.gpu_tests --lanes): judges in the test's own process at
# the benchmark shape whose checked calls are many (every shipped variant, each with its declared cases and weight
# changes). Each call waits while a batch judge times with the GPU to itself, so beside the batch they took several
# times their time alone (one H200: the logsumexp problem's six variants 13 s alone, 90 s beside the batch).
AFTER_BATCH = ("test_every_shipped_variant_accepted",)


# Set by tools.gpu_tests for a GPU's first lane, which starts beside the playground's kernel build: the file it writes
# once the build has ended. The batch's candidates build their own extensions meanwhile; its slots, whose boxes read
# the kernel cache and cannot add to it, start after.
KERNELS_BUILT = "KP_KERNELS_BUILT"


def kernels_built(poll_s: float = 0.5, most_s: float = 1800.0) -> None:
    """Waits for the file KERNELS_BUILT names, where it names one (at most most_s: past it, the jobs that needed a
    kernel say which)."""
    import os
    import time

    flag, end = os.environ.get(KERNELS_BUILT), time.monotonic() + most_s
    while flag and not Path(flag).exists() and time.monotonic() < end:
        time.sleep(poll_s)


def exit_code(line: dict) -> int:
    """What `run.py` would have exited with for this job: 0 accepted, 1 rejected, 2 no verdict (its status)."""
    return EXIT_CODES[line["status"]]


def job_of(argv: list) -> jobfile.Job:
    """The batch job a single command (`--ref R --candidate C ...` or `--problem P --candidate C ...`) stands for."""
    args = run.parse_args([str(a) for a in argv])
    ref = ("file", args.ref) if args.ref else ("problem", args.problem[0])
    return jobfile.make_job(ref, args.candidate[0], run.judge_opts(args))


def judge_batch(
    argvs: dict[str, list], gpus: list[str | None], folder: Path, timeout_s: float = backends.DEFAULT_TIMEOUT_S
) -> dict[str, dict | None]:
    """argvs: name -> a single command's arguments (`--ref R --candidate C ...` or `--problem P --candidate C ...`);
    gpus: one entry per slot (a GPU id as `--gpus` takes it, or None for a CPU slot). Returns name -> the job's
    result line (None if the batch recorded none for it: the test then says so)."""
    jobs = {name: job_of(argv) for name, argv in argvs.items()}
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "results.jsonl"
    backends.run_local(
        list(jobs.values()),
        gpus,
        out,
        timeout_s,
        progress=False,
        log_dir=folder / "logs",
        before_slots=kernels_built,
    )
    by_key = {d["key"]: d for d in jobfile.read_results(out)}
    return {name: by_key.get(job.key()) for name, job in jobs.items()}


def said(line: dict | None) -> str:
    """A result line in words for an assertion's message: the verdict, the table, the judge's log."""
    if line is None:
        return "the batch recorded no result for this job (its log folder has the slot's output)"
    from kp.observe import report

    table = report.format_record(line["record"]) if line.get("record") else ""
    return "\n".join([line["verdict"], table, *line.get("log", [])[-20:], line.get("traceback", "")])
