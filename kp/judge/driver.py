"""The judge: one set of stages for the playground's own variants and for anybody's ModelNew, against any
KernelBench-format reference (a file with ``Model``, ``get_inputs()``, ``get_init_inputs()``; the built-in problems
under models/ are such files with optional extras: declared ``CASES``, ``traffic``, ``BOUND``, ``PRECISIONS``).

This process owns the inputs, the fp32 and float64 references, every comparison and the verdict. The models being
judged live in a *runner*: for a candidate file, a worker process of its own that imports it (so it cannot patch the
comparisons; the worker fingerprints the torch/time namespaces and reports any change); for the playground's own
variants, the same Worker class called in this process. Either way the same commands run in the same order.

Stages (a failure rejects that row with a one-line reason, ``rejected: <stage>: <reason>``):
 1. construct: ``ModelNew(*get_init_inputs())`` after the reference's seed; the reference's state_dict is loaded
    into it (by name, in order where names differ but shapes line up, or by name and shape).
 2. parity, one stateful sequence of calls on benchmark-shape inputs: ``trials`` calls on fresh inputs, with the
    weights changed between them the ways training does (an optimizer step on random gradients, a
    ``load_state_dict`` of new values, an in-place edit), then derived inputs (negated, x100, shifted) where the
    float64 reference stays finite; then every declared case on a fresh model. Per call: the allocator's cached
    free memory is NaN-filled, the candidate runs on its own copy, its inputs are compared bit for bit afterwards,
    every output element is compared with the float64 reference (relL2 overall and worst row within
    max(4 x PyTorch's own error in the chosen precision, the floor: 1e-6 in fp32, one rounding u in fp16/bf16, or
    fp32 accumulation's 2 u32 sqrt(K)); NaN/Inf positions must match), then buffers (BatchNorm running statistics)
    are compared with the reference's. In fp16 and bf16 every floating input, weight and buffer is cast to the
    dtype first, on every side (kp.judge.reference.Reference.use_precision).
 3. escape: one call inside a profiler window bounded by marker kernels; any GPU work outside it, or a host clock
    that sees more than the events, rejects.
 4. own kernel: the profiled call must run a kernel from a shared object the row loaded (its load_inline build or
    the playground's kernel cache), unless ``allow_torch`` (the row is then labelled pure PyTorch).
 5. timing: eager, torch.compile and every row interleaved (kp.lib.timing.bench_interleaved), every call on inputs
    drawn just before it from an OS seed, after one more weight change; after each timed call the judge decides
    whether to check it (one per row at a secret rep, perhaps one more at random), outside the timed region and
    after a device-wide synchronize; the samples are told here call by call, reduced here and bounded by the wall
    time this process saw.

This module holds the driver (Judge.run: the stages of STAGES, kp.judge.stages, in order; the record) and the
judge's run: the state every stage reads and writes (the options, the reference at its shape, the rows and their
runners, the notes, the clock, the deadline). Each stage lives in a module of its own as functions of that run:
kp.judge.construct (the memory plan, the baselines, imports), kp.judge.parity_stage (parity: kp.judge.parity,
kp.judge.family_parity, one checked call in kp.judge.calls), kp.judge.kernelbench (KernelBench's own check),
kp.judge.timed (escape and own kernel, kp.judge.escape; timing), kp.judge.ceilings (traffic, memory, ceilings),
kp.judge.observe (--profile, --ncu). Every stage has one interface, ``stage_<name>(run, rec, init)``; a new check is
a function in the stage it belongs to, or a new stage (a function and one entry of STAGES).
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from pathlib import Path

import torch

from kp.box import sandbox
from kp.lib.build import prebuild, progress
from kp.errors import NoVerdict, OutOfMemory, Rejected, UsageError, failed_figures
from kp.judge.expected import Row
from kp.judge.reference import Reference
from kp.lib.registry import picks_per_call, runnable_variants, variant_factory
from kp.judge.escape import EscapeCheck
from kp.judge.construct import cuda_builds_on_cpu
from kp.judge.memory import out_of_memory, own_oom
from kp.judge.record import process_age_s, record_head, record_tail
from kp.judge.family import apply_at, module_sizes
from kp.judge.backward import GradientCheck
from kp.judge.probes import Probes
from kp.judge.parity import parity_cases
from kp.judge.stages import AFTER_WORKERS, BUILD_STAGE, STAGES, WAIT_STAGE
from kp.judge.timed import interim
from kp.judge.runners import LocalRunner, ProcessRunner, candidate_runner
from kp.judge.clock import StageClock
from kp.judge.options import MIN_TRIALS, JudgeOptions
from kp.lib import gpu_lock

STILL_FIRST_S, STILL_EVERY_S = 10.0, 20.0  # a stage still running says so after this long, then this often
MIN_CHECKED = MIN_TRIALS  # checked calls a row must pass to be accepted, on any device

# ---------------------------------------------------------------------------------------------------------------
# The judge.


def row_specs(ref: Reference, variant_list: list[str], precision: str = "fp32") -> list[tuple[str, str, dict, bool]]:
    """(label, variant, ModelNew options, peer) of every row of a built-in problem: each variant as is, plus each
    variant under each of the problem's ROW_OPTIONS (e.g. matmul_sum_max_mean_lse's cache=False) that applies to
    the precision judged."""
    out = [(v, v, {}, False) for v in variant_list]
    for tag, opts in getattr(ref.module, "ROW_OPTIONS", {}).items():
        opts = dict(opts)
        only = opts.pop("variants", None)  # an option that applies to some rungs only (e.g. a cuBLAS mode)
        peer = bool(opts.pop("peer", False))
        if precision not in opts.pop("precisions", (precision,)):
            continue
        out += [(f"{v}[{tag}]", v, dict(opts), peer) for v in variant_list if only is None or v in only]
    return out


def default_variants(problem: str, include_records: bool = False, precision: str | None = "fp32") -> list[str]:
    """The rows of a built-in problem's table: the rungs of its ladder that run on this GPU in this precision (and
    the records with include_records: --variant all), plus "auto" where the model picks a rung per call."""
    vs = runnable_variants(problem, include_records, precision)
    return vs + (["auto"] if picks_per_call(problem) else [])


def name_failures(rows: list[Row], stage: str) -> None:
    """The stage that just ran named in each failure it made (a row's failure knows its kind and check)."""
    for row in rows:
        if row.failure is not None and row.failure["stage"] is None:
            row.failure["stage"] = stage


def enough_checks(rows: list[Row], rec: dict, no_room: str | None, name: str, log) -> None:
    """No acceptance without checks: a row that would be accepted on fewer than MIN_CHECKED checked calls (its
    shapes did not fit where it ran, and it declares too few cases) gets no verdict, on any device."""
    short = [r for r in rows if r.accepted and not r.peer and len(r.checks) < MIN_CHECKED]
    if short:
        if rec.get("notes"):  # the whole reason, its figures, before the verdict
            log(f"{name}: {rec['notes']}")
        why = no_room or rec.get("notes") or "too few calls could be checked here"
        raise NoVerdict(
            f"{name}: no verdict: {', '.join(r.label for r in short)} passed "
            f"{min(len(r.checks) for r in short)} of the {MIN_CHECKED} checked calls it needs ({why}); "
            f"judge it on a GPU or a larger host"
        )


@contextlib.contextmanager
def still_in(stage: str, say, first_s: float = STILL_FIRST_S, every_s: float = STILL_EVERY_S):
    """A stage that runs long says so while it runs: after first_s, then every every_s ('kernelbench check: 24 s so
    far'), so a judgement of a large shape on the CPU is never silent for long."""
    done = threading.Event()
    t0 = time.monotonic()

    def tick():
        wait = first_s
        while not done.wait(wait):
            say(f"{stage}: {time.monotonic() - t0:.0f} s so far")
            wait = every_s

    ticker = threading.Thread(target=tick, name="kp-still-in", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()


class Judge:
    def __init__(
        self,
        ref: Reference,
        opts: JudgeOptions | None = None,
        *,
        min_reps: int = 10,
        max_reps: int = 100,
        budget_s: float = 20.0,
        log=progress,
        **options,
    ):
        """opts: how to judge (kp.judge.options.JudgeOptions; or its fields as keywords, `options`). min_reps,
        max_reps, budget_s: the timing's bounds (the tests shorten them)."""
        opts = opts if opts is not None else JudgeOptions.from_mapping(options)
        self.opts = opts
        seed, trials, precision, device = opts.seed, opts.trials, opts.precision, opts.device
        bench, compile_baseline, allow_torch = opts.bench, opts.compile_baseline, opts.allow_torch
        sandbox = opts.sandbox
        profile, ncu, mode, timeout_s, shapes = opts.profile, opts.ncu, opts.mode, opts.timeout_s, opts.shapes
        if device is None:
            if not torch.cuda.is_available():
                raise UsageError(
                    "no CUDA device visible: use a GPU machine (or --device cpu for the host-side "
                    "parity checks of a pure-torch candidate)"
                )
            device = "cuda"
        if device == "cuda" and not torch.cuda.is_available():
            raise UsageError("no CUDA device visible")
        self.ref, self.precision, self.device, self.trials = ref.use_precision(precision), precision, device, trials
        self.bench, self.compile_baseline, self.allow_torch = bench, compile_baseline, allow_torch
        self.reps = (min_reps, max_reps, budget_s) if bench else (3, 3, 5.0)
        self.sandbox, self.box_note = sandbox, None  # box_note: what the record says once a candidate is added
        self.profile, self.ncu = profile, ncu
        self.seed = int.from_bytes(os.urandom(4), "little") if seed is None else seed
        self.log = log
        self.mode, self.train = mode, mode == "train"
        self.backward = opts.backward
        self.prev_grads = {}  # per row: the gradients its last checked call must have left (accumulation)
        self.timeout_s = timeout_s
        self.shapes = shapes  # a count, or members' names (kp.judge.family)
        self.deadline = time.monotonic() + timeout_s if timeout_s else None
        self.notes: list[str] = []  # said in the verdict line and the record: what the judge could not do as usual
        self.rows: list[Row] = []
        self.runners: list = []
        self.rng = random.SystemRandom()  # which timed calls are checked: decided here, after each call
        self.check_at: dict[str, int] = {}
        self.timed_checks: dict[str, int] = {}
        self.timed_samples: dict[str, list] = {}  # each timed call's sample, as the worker told it right after it
        self.call_log: dict[str, list] | None = None  # a stateful reference: each row's calls while timing, in order
        self.row_refs: dict | None = None  # ... and each row's own references, advanced through them
        self.input_buffers: dict[int, torch.Tensor] = {}
        self.t_start = time.perf_counter()
        self.before_judge_s = process_age_s()  # the interpreter's start, imports, argument parsing, a box's start
        self._fp = None
        # where the float64 reference runs: decided with the memory plan (kp.judge.plan.float64_on_gpu); the host until
        # then and on --device cpu
        self.f64_device, self.f64_where = "cpu", "the host (--device cpu)"
        self.f64_chunks = 0  # > 0: on the GPU in that many slices of the batch (kp.judge.plan.float64_chunks)
        self.baseline_args = None  # what built the eager and torch.compile baselines in each worker, where built
        self.prime_args = None  # without them: what runs the reference once in each candidate's worker (cmd_prime)
        self.gpu_at_plan = None  # (free, the judge's own) GPU bytes when the memory plan was made (kp.judge.plan)
        self.others_at_plan = 0  # GPU bytes other processes held then (kp.judge.plan.held_by_others)
        self.gpu_wait_s = 0.0  # waiting for other judges on this GPU (kp.lib.gpu_lock)
        self.gpu_own = False  # the GPU held against every other judge on this host, from the escape stage on
        self.clock = StageClock()  # seconds inside the stages, by part
        # What the stages learn as they run, each set by the one stage that owns it (None until then): the references
        # (fp32 and float64, kp.judge.expected._Refs; parity), the benchmark-shape output's RMS per output (parity),
        # the input buffers a call before left for the next (the checked calls), whether parity ran at the
        # benchmark's shape and why not (parity), when parity and the GPU stages began (for their log lines), the
        # checks skipped with why (the record's head)
        self.refs = None
        self.bench_rms: list | None = None
        self.retired_buffers: dict = {}
        self.bench_parity = False
        self.no_room: str | None = None
        self.t_parity = self.t_gpu_stages = None
        self.skipped: list = []
        self.stage_now: str | None = None  # the stage running: a row it rejects has its failure's stage named so
        self.held: contextlib.ExitStack | None = None  # what a stage holds until the stages end
        # --at: the sizes ({name: (benchmark's, judged)}) of the shape judged in place of the benchmark's, set when the
        # run starts (kp.judge.family.apply_at), and the benchmark's shape
        self.at_sizes: dict = {}
        self.at_bench: str | None = None
        self.gradients = GradientCheck(self.notes, log, ref.name, self.clock)
        self.probes = Probes(precision)  # what no kernel computes, judged at the benchmark shape's calls
        self.escape_check = EscapeCheck(
            self.seed,
            allow_torch,
            opts.backward,
            lambda: self.device == "cuda" and not self.gpu_own,
            log,
            self.clock.tally,
        )
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()

    @property
    def fp(self) -> dict:
        """The reference's footprint (shapes, bytes, FLOPs, live peak), taken on first use: the candidates' workers
        are started when they are added, so their start-up (a box, torch's import) runs while this is measured."""
        if self._fp is None:
            self._fp = self.ref.footprint(self.device, self.train)
        return self._fp

    # -- rows ---------------------------------------------------------------------------------------------------
    def add_candidate(self, path: str | Path) -> Row:
        path = Path(path)
        if not path.is_file():
            raise UsageError(f"candidate file {str(path)!r} does not exist")
        if path.suffix != ".py":  # Python imports no other name; said as what it is, not as an import's traceback
            raise UsageError(
                f"candidate file {str(path)!r} is not a Python file: a candidate is a .py file that defines ModelNew"
            )
        boxed, self.box_note = sandbox.choice(self.sandbox)
        if boxed:
            self.log(f"candidate {path.name}: in a sandbox ({self.box_note})")

        def start() -> ProcessRunner:
            runner = candidate_runner(
                self.ref.spec,
                path,
                self.device,
                self.precision,
                self._told,
                boxed=boxed,
                train=self.train,
                deadline=self.deadline,
                limit_s=self.timeout_s,
            )
            self.runners.append(runner)
            self._off_the_clock(getattr(runner, "build_wait_s", 0.0))  # its wait for its build ahead
            runner.passed = row.checks
            return runner

        row = Row("candidate", None, path=str(path), respawn=start)
        row.runner = start()
        self.rows.append(row)
        return row

    def add_variants(self, rows: list[tuple[str, str, dict, bool]]) -> list[Row]:
        if not rows:
            return []
        factories = {label: variant_factory(self.ref.module, v, opts, self.precision) for label, v, opts, _ in rows}
        runner = LocalRunner(self.ref.spec, self.device, self.precision, self._told, factories, self.train)
        self.runners.append(runner)
        out = [Row(label, runner, peer=peer, opts=opts, variant=v) for label, v, opts, peer in rows]
        self.rows += out
        return out

    def add_reference_row(self) -> Row:
        """The reference's own fp32 Model as a judged row ("eager"): what `--ref FILE` alone checks on the CPU, where
        nothing is timed (every parity stage against the float64 reference, PyTorch's own error in the table)."""
        runner = LocalRunner(
            self.ref.spec,
            self.device,
            self.precision,
            self._told,
            {"eager": lambda *init: self.ref.module.Model(*init)},
            self.train,
        )
        self.runners.append(runner)
        row = Row("eager", runner, reference=True)
        self.rows.append(row)
        return row

    def live(self) -> list[Row]:
        return [r for r in self.rows if r.accepted]

    def _each(self, stage_fn):
        """Run stage_fn(row) for every live row; a Rejected rejects that row only."""
        for row in self.live():
            if not row.accepted:  # rejected by an earlier row's stage (a timed-call check)
                continue
            try:
                stage_fn(row)
            except Rejected as e:
                if isinstance(e, OutOfMemory):  # the row's own doing (else GpuMemoryShort: no verdict)
                    e = Rejected(out_of_memory(self, row, e), figures=failed_figures(e), kind="out_of_memory")
                row.reject(e)
                at = row.failure["check"] or self.stage_now or "a check"
                if row.failure.get("needs") == "cuda":  # the host's lack, not the row's: the driver makes it no verdict
                    self.log(f"{self.ref.name}: {row.label} asks for CUDA at {at}, which this host does not have")
                else:
                    self.log(f"{self.ref.name}: {row.label} rejected at {at} ({row.failure['kind']})")

    # -- the whole run ------------------------------------------------------------------------------------------
    def run_cases(self) -> list[Row]:
        """The declared cases alone (small shapes, e.g. under compute-sanitizer); returns the rows."""
        self.skipped = []
        try:
            parity_cases(self)
        finally:
            for runner in self.runners:
                runner.close()
        return self.rows

    def run(self) -> dict:
        """The driver: every stage of STAGES that applies, in order, with the workers up; then those of
        AFTER_WORKERS once the workers are closed. The seconds each took go into the record."""
        sizes = module_sizes(self.ref.module)  # put back at the end: a smaller shape judged here is this run's
        try:
            # --at: the shape judged from the first measurement on; the workers take it as they are made ready
            if self.opts.at:
                bench, self.at_sizes, self._fp = self.fp["shapes"], apply_at(self.ref, self.opts.at), None
                self.at_bench = bench if self.at_sizes else None
                self.notes.append(
                    f"judged at {self.fp['shapes']} (--at {self.opts.at}), not the benchmark's {bench}"
                    if self.at_sizes
                    else f"--at {self.opts.at}: the benchmark's own sizes"
                )
            return drive(self)
        finally:
            vars(self.ref.module).update(sizes)

    def _told(self, msg: dict):
        """A timed call told by a worker (kp.judge.timed.interim answers it)."""
        return interim(self, msg)

    def skip(self, what: str) -> None:
        """A check that cannot apply here: said in the record's head and in the log."""
        self.skipped.append(what)
        self.log(f"{self.ref.name}: skipped {what}")

    def _build_s(self) -> float:
        """Seconds the candidates' workers have spent in their own load/load_inline calls so far."""
        return sum(getattr(r, "build_s", 0.0) for r in self.runners)

    def _waited_for_gpu(self, seconds: float) -> None:
        """Time spent waiting for other judges on this GPU is not the job's: its deadline, and its workers', move."""
        self.gpu_wait_s += seconds
        self._off_the_clock(seconds)

    def _off_the_clock(self, seconds: float) -> None:
        """Seconds that are not the job's (a wait for the GPU, for the candidate's build ahead): its deadline, and
        its workers', move."""
        if not seconds:
            return
        if self.deadline is not None:
            self.deadline += seconds
        for runner in self.runners:
            if getattr(runner, "deadline", None) is not None:
                runner.deadline += seconds


def drive(run) -> dict:
    """The stage table over the judge's run: the record's head (the footprint measured), every stage of STAGES that
    applies with the workers up, then those of AFTER_WORKERS once they are closed; the seconds each took, the waits
    for the GPU and the candidates' builds apart, into the record."""
    t0 = time.perf_counter()
    rec = record_head(run, run.device == "cuda")  # measures the footprint: a meta-device forward
    init = run.ref.init()
    built = run._build_s()  # a box lent its candidate's build folder waits there for the build running ahead
    seconds: dict[str, float] = {
        "judge start": t0 - run.t_start - built,  # its CUDA context, workers started
        "footprint": time.perf_counter() - t0,
    }
    if built > 0:
        seconds[BUILD_STAGE] = built
    gpu_lock.GPU_WAITS.append(run._waited_for_gpu)
    try:
        with contextlib.ExitStack() as run.held:  # what a stage holds until the stages end (the GPU to itself)
            run_stages(run, STAGES, rec, init, seconds)
    except torch.OutOfMemoryError as e:  # the plan checked the free memory at the start; it can shrink since
        raise own_oom(run, e, list(seconds)) from None
    finally:
        gpu_lock.GPU_WAITS.remove(run._waited_for_gpu)
        for runner in run.runners:
            runner.close()
    run_stages(run, AFTER_WORKERS, rec, init, seconds)
    cuda_builds_on_cpu(run)
    enough_checks(run.rows, rec, run.no_room, run.ref.name, run.log)
    rec["stage_seconds"] = {k: round(v, 2) for k, v in seconds.items()}
    rec["stage_detail"] = run.clock.largest_first()
    rec["gpu_wait_s"] = round(run.gpu_wait_s, 2)
    rec["boxes_started_ahead"] = [r.box_ahead for r in run.runners if hasattr(r, "box_ahead")]
    missed = [m for r in run.runners for m in getattr(r, "box_missed", [])]
    if missed:  # a box started ahead that did not serve: why (its plan differed, it had exited)
        rec["boxes_passed_over"] = missed
    return record_tail(run, rec, run.device == "cuda")


def run_stages(run, stages, rec: dict, init, seconds: dict) -> None:
    """Each stage that applies, in order, its seconds added to `seconds` under its name, its waits for other judges
    on the GPU and the candidates' builds inside it under theirs; a stage that shares the GPU holds its gate."""
    for stage in stages:
        if not stage.applies(run):
            continue
        run.stage_now = stage.name
        t0, waited, built = time.perf_counter(), run.gpu_wait_s, run._build_s()
        shared = stage.shares_gpu(run) and run.device == "cuda" and not run.gpu_own
        try:
            with (
                gpu_lock.gpu_shared(run.log) if shared else contextlib.nullcontext(),
                still_in(stage.name, lambda said: run.log(f"{run.ref.name}: {said}")),
            ):
                stage.run(run, rec, init)
        finally:
            name_failures(run.rows, stage.name)
        waited, built = run.gpu_wait_s - waited, max(run._build_s() - built, 0.0)
        for name, s in (
            (stage.name, time.perf_counter() - t0 - waited - built),
            (WAIT_STAGE, waited),
            (BUILD_STAGE, built),
        ):
            if s > 0 or name == stage.name:
                seconds[name] = seconds.get(name, 0.0) + max(s, 0.0)


def evaluate(
    ref: Reference | str,
    candidate: str | Path | None = None,
    variants: list[str] | None = None,
    opts: JudgeOptions | None = None,
    **kw,
) -> dict:
    """Judge a candidate file and/or the playground's variants against a reference (a Reference, or a built-in
    problem id), with `opts` (or JudgeOptions' fields as keywords, beside Judge's own: log, the timing's bounds).
    Returns the record: its status and failure, and rec['rows'][label] each row's."""
    if isinstance(ref, str):
        ref = Reference.load(("problem", ref))
    j = Judge(ref, opts, **kw)
    if variants:
        if ref.problem is None:
            raise UsageError("variants belong to built-in problems; --ref files are judged with --candidate")
        j.add_variants(row_specs(ref, variants, j.precision))
    if candidate is not None:
        j.add_candidate(candidate)
    # the reference alone, nothing timed: its own Model's parity against float64
    if not j.rows and (j.device == "cpu" or not j.bench):
        j.add_reference_row()
    elif not j.rows:  # the reference alone: eager vs torch.compile vs the ceilings
        j.runners.append(LocalRunner(ref.spec, j.device, j.precision, j._told, {}, j.train))
    return j.run()


def judge_job(
    ref: Reference | tuple[str, str],
    candidate: str | Path | None,
    opts: JudgeOptions,
    variants: list[str] | None = None,
    log=progress,
) -> dict:
    """One job, judged as every way in judges it (the command line, a batch's slot, JudgeSession, the warm judge):
    a reference (or its spec: ("file", path) or ("problem", id)) and a candidate file; or, with no candidate, a
    built-in problem's rows (`variants`, else the ladder this GPU runs in the precision), their kernels built first
    in parallel on a GPU. Returns the record."""
    if not isinstance(ref, Reference):
        ref = Reference.load(ref)
    if candidate is None and ref.problem and opts.device != "cpu":
        variants = variants or default_variants(ref.problem, precision=opts.precision)
        prebuild(ref.problem, variants)
    return evaluate(ref, candidate, variants if candidate is None else None, opts, log=log)
