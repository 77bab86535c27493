"""--sanitize: the candidate's call under compute-sanitizer's four tools, and once with shared memory filled, after
every other check passed. A kernel that reads out of bounds, reads memory nothing wrote, or whose threads race on
shared memory can give right outputs on every call a judge makes and wrong ones on another GPU, driver or load; the
tools see such accesses as they happen.

Each tool runs a worker of its own, boxed like any other (kp.box.start.start_wrapped: the tool inside the box, the
worker under it), at the smallest shape the judge judged and the row passed (the benchmark's, or the smallest member
of the shape family that --shapes judged: never a shape the row was not judged at, where a file's fixed sizes are
KernelBench's contract), with PyTorch's allocator handing out each tensor as an allocation of its own size, so a read
past a tensor's end is out of bounds for the tool too. The worker builds the row as parity did, runs one call (and
its backward pass under --backward) and ends; the judge reads the tool's report. A hazard in a kernel of the row's
own (the own-kernel check's list) rejects it, as `memory_error` (memcheck, initcheck) or `race` (racecheck,
synccheck), with the tool's first lines (the access, the kernel, the thread and block) in the reason and the whole
report in the record; a hazard in a kernel that is not the row's (PyTorch's own: racecheck flags its reduce_kernel)
is said and never counted. No tool tracks shared memory no thread wrote: a fifth pass, its calls alone on the GPU, runs
the call after every SM's shared memory was filled with 0x00 and then with 0xFF (kp/kernels/shared_poison.cu), and an
output finite after the one and not after the other rejects it. A pass that cannot run the candidate (its process
fails, a JIT the tool does not take, the time limit) is said, never a rejection."""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import util
from pathlib import Path

import torch

from kp.box import sandbox
from kp.errors import Rejected, UsageError, first_line
from kp.judge.construct import build_row
from kp.judge.expected import Row
from kp.judge.family import meta_shapes
from kp.judge.members import said_sizes
from kp.judge.runners import ProcessRunner, candidate_runner
from kp.lib.build import build_path
from kp.lib.gpu_lock import gpu_to_itself
from kp.observe.profile import kernel_base_name
from kp.worker.sanitized import SHARED_POISON

# The tools, each with the failure kind its hazards are.
TOOLS = (
    ("memcheck", "memory_error"),
    ("initcheck", "memory_error"),
    ("racecheck", "race"),
    ("synccheck", "race"),
)
# Each tensor an allocation of its own, of its own size (PyTorch's allocator then calls cudaMalloc for each): the
# caching allocator carves tensors out of larger blocks, inside which a read past a tensor's end is in bounds for
# the tool. memcheck pads every allocation, so a read up to 4 KiB past one's end lands in no other.
TOOL_ENV = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
TOOL_ARGS = {"memcheck": ("--padding", "4096")}
# The pass beside the tools: the call after every SM's shared memory was filled (kp/kernels/shared_poison.cu).
SHARED = "shared memory"
TOOL_LIMIT_S = 300.0  # one tool's worker, start to end (bounded by the job's deadline too)
END_WAIT_S = 30.0  # the worker's own end, after its last reply: the tool writes its summary then
REPORT_CHARS = 16000  # of each tool's report, kept in the record
PREFIX = "========="


def sanitizer_path() -> str | None:
    """compute-sanitizer: on PATH, else in the CUDA toolkit torch's extension builder finds."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    home = sandbox.cuda_toolkit()
    path = os.path.join(home, "bin", "compute-sanitizer") if home else None
    return path if path and os.access(path, os.X_OK) else None


@dataclasses.dataclass
class Hazard:
    """One report of a tool: what it saw (its first line), the kernel it names, where (thread and block, where it
    says) and the access's address (the whole report stays in the record)."""

    tool: str
    what: str
    kernel: str | None
    where: str | None
    address: str | None

    def said(self) -> str:
        parts = [self.what]
        if self.kernel:
            parts.append(f"in {self.kernel}")
        parts += [p for p in (self.where, self.address) if p]
        return ", ".join(parts)


# The lines of a report that are the tool's own bookkeeping, not a hazard.
_NOT_HAZARDS = re.compile(
    r"^(COMPUTE-SANITIZER|ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY|Target application returned|"
    r"Program hit .* on CUDA API call|This tool|Note:|Warning:)"
)
_AT = re.compile(r"\bat (.+?)\+0x[0-9a-fA-F]+")


def parse_report(text: str, tool: str) -> list[Hazard]:
    """The hazards of a tool's report (its lines all begin with the tool's prefix; a report is a line at the
    prefix's own indent, then its detail lines indented, then an empty one). An error a CUDA call returned
    ("Program hit ... on CUDA API call") follows from a hazard, and is not one."""
    blocks: list[list[str]] = []
    current = None  # the report being read; an empty line ends it
    for raw in text.splitlines():
        if not raw.startswith(PREFIX):
            continue
        body = raw[len(PREFIX) :]
        if not body.strip():
            current = None
        elif body.startswith("  ") and current is not None:
            current.append(body.strip())
        else:
            current = [body.strip()]
            blocks.append(current)
    out = []
    for b in blocks:
        if _NOT_HAZARDS.match(b[0]):
            continue
        m = next((found for ln in b if (found := _AT.search(ln))), None)
        where = next((ln for ln in b if ln.startswith("by thread") or " in block " in ln), None)
        at = next((i for i, ln in enumerate(b) if ln.startswith(("Address", "Access to"))), None)
        address = None
        if at is not None:  # memcheck's next line says where the access fell ("and is 373 bytes after ...")
            address = " ".join(
                b[at : at + 2] if b[at + 1 : at + 2] and b[at + 1].startswith("and is") else b[at : at + 1]
            )
        what = _AT.sub("", b[0]).removeprefix("Error: ").strip()
        if len(b) > 1 and b[1].startswith("and ") and " access" in b[1]:  # racecheck's second access
            what += " " + _AT.sub("", b[1]).strip()
        out.append(Hazard(tool, " ".join(what.split()), m.group(1).strip() if m else None, where, address))
    return out


def own_hazards(hazards: list[Hazard], own_kernels) -> tuple[list[Hazard], list[Hazard]]:
    """The hazards in kernels of the row's own (their names as the own-kernel check saw them run) and the rest."""
    own = {kernel_base_name(k) for k in own_kernels}
    mine = [h for h in hazards if h.kernel and kernel_base_name(h.kernel) in own]
    return mine, [h for h in hazards if h not in mine]


def _input_elements(ref, sizes: dict) -> float:
    """The reference's input elements at `sizes` ({name: (now, there)}), from its inputs drawn on the meta device."""
    g = vars(ref.module)
    old = {k: g[k] for k in sizes}
    g.update({k: new for k, (_, new) in sizes.items()})
    try:
        shapes = meta_shapes(ref.module)
    finally:
        g.update(old)
    return sum(math.prod(s) for s in shapes) if shapes else math.inf


def sanitize_shape(run, rec: dict) -> tuple[dict, str]:
    """The smallest shape the row was judged at: the benchmark's ({}), or the family member --shapes judged with
    the fewest input elements ({size: (benchmark's, member's)}); and the shape as said."""
    judged = [e for e in rec.get("family") or [] if "skipped" not in e and e.get("sizes")]
    g = vars(run.ref.module)
    best, best_n = {}, _input_elements(run.ref, {})
    for e in judged:
        sizes = {k: (g[k], v) for k, v in e["sizes"].items() if k in g}
        n = _input_elements(run.ref, sizes)
        if n < best_n:
            best, best_n = sizes, n
    if not best:
        return {}, f"{run.fp['shapes']} (the benchmark's)"
    return best, f"{said_sizes(best)} (the smallest member --shapes judged)"


@dataclasses.dataclass
class ToolRun:
    """What one pass's worker did: its hazards (own: already the row's, not told apart by kernel), whether the row's
    call ran to its end there (and why not), the tool's report and the pass's seconds."""

    tool: str
    kind: str
    hazards: list[Hazard]
    ran: bool
    why: str | None
    report: str
    seconds: float
    exit_code: int | None
    own: bool = False


def _worker(run, row: Row, deadline: float, wrap: tuple = (), env: dict | None = None) -> ProcessRunner:
    """A worker of the pass's own for the row's file: under the tool in a box of its own (wrap), else as the row's
    own worker was made (boxed where the judge boxes)."""
    return candidate_runner(
        run.ref.spec,
        row.path,
        run.device,
        run.precision,
        run._told,
        boxed=sandbox.choice(run.sandbox)[0],
        train=run.train,
        deadline=deadline,
        limit_s=deadline - time.monotonic(),
        wrap=wrap,
        env=env,
    )


def _made(run, runner, row: Row, stage: str, sizes: dict, init) -> None:
    """The row's file imported in the pass's worker, scaled to the shape (--at's first, as the workers took it,
    then the member's) and the row built as parity built it."""
    r = runner.call(stage, "load", str(Path(row.path).resolve()))
    if not r["has_model_new"]:
        raise UsageError("the file defines no ModelNew in this worker")
    for scale in (run.at_sizes, sizes):
        if scale:
            runner.call(stage, "scale", scale)
    build_row(run, Row(row.label, runner, path=row.path), run.refs, init, run.seed, stage=stage)


def _deadline(run) -> float:
    limit = time.monotonic() + TOOL_LIMIT_S
    return min(limit, run.deadline) if run.deadline is not None else limit


@dataclasses.dataclass
class Pass:
    """One pass of a row: its tool (or SHARED), failure kind, the tool's log file, and its worker, started in the
    judge's main thread (a process started from a thread while another imports can deadlock in its child: Python's
    preexec_fn runs there) or why it could not start."""

    tool: str
    kind: str
    log: str | None
    runner: ProcessRunner | None = None
    why: str | None = None
    t0: float = dataclasses.field(default_factory=time.perf_counter)


def _start_pass(run, row: Row, tool: str, kind: str, path: str | None) -> Pass:
    """The pass's worker started now: under the tool, in a box of its own, for a tool; as the row's own was made for
    the shared-memory pass, the judge's fill kernel built first so the worker loads it from the cache."""
    log = None
    try:
        if tool == SHARED:
            build_path(SHARED_POISON, "judge", quiet=True)
            return Pass(tool, kind, None, _worker(run, row, _deadline(run)))
        fd, log = tempfile.mkstemp(prefix=f"kp-sanitize-{tool}-", suffix=".log", dir=util.get_temp_dir())
        os.close(fd)
        wrap = (path, "--tool", tool, "--log-file", log, "--print-limit", "20", *TOOL_ARGS.get(tool, ()))
        return Pass(tool, kind, log, _worker(run, row, _deadline(run), wrap, TOOL_ENV))
    except Exception as e:  # its worker could not start (its fill kernel did not build): said, not judged
        return Pass(tool, kind, log, None, first_line(e) or type(e).__name__)


def _tool_call(run, row: Row, p: Pass, sizes: dict, init) -> list:
    """The row built in a tool's worker and one call there; the tool sees what it sees (its report, read later)."""
    stage = f"sanitize ({p.tool})"
    _made(run, p.runner, row, stage, sizes, init)
    p.runner.call(stage, "sanitized_call", row.label, (run.seed + 3000) % 2**32, run.backward)
    return []


def _finite(out) -> list:
    """The finite-or-not masks of an output's floating tensors, in order."""
    parts = out if isinstance(out, tuple) else (out,)
    return [torch.isfinite(t) for t in parts if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _shared_made(run, row: Row, p: Pass, sizes: dict, init) -> str | None:
    """The row built in the shared-memory pass's worker, beside the tools' passes (only its calls need the GPU
    alone); None, or why it could not be."""
    if p.runner is None:
        return p.why
    try:
        _made(run, p.runner, row, f"sanitize ({SHARED})", sizes, init)
        return None
    except Exception as e:  # as _run_pass says a pass it could not run
        return first_line(e) or type(e).__name__


def _shared_calls(run, row: Row, p: Pass, sizes: dict, init) -> list:
    """The row's call twice in the pass's worker (the row built there already), every SM's shared memory filled
    with 0x00 bytes before the first and 0xFF bytes (NaN) before the second: a position finite after the first and
    not after the second was computed from shared memory the call never wrote (kp/kernels/shared_poison.cu says why
    a fill reaches the next kernel)."""
    stage = f"sanitize ({SHARED})"
    seed = (run.seed + 3001) % 2**32
    outs = [p.runner.call(stage, "sanitized_call", row.label, seed, run.backward, fill)["out"] for fill in (0, 255)]
    zero, nan = (_finite(o) for o in outs)
    if len(zero) != len(nan) or any(a.shape != b.shape for a, b in zip(zero, nan)):
        raise UsageError("its two outputs differ in number or shape")
    lost = sum(int((a & ~b).sum()) for a, b in zip(zero, nan))
    if not lost:
        return []
    what = (
        f"its output is NaN or Inf at {lost} of {sum(a.numel() for a in zero)} positions that are finite with "
        f"shared memory filled with 0x00 beforehand, once every SM's shared memory holds 0xFF (NaN) before the "
        f"call: it computes with shared memory it never wrote"
    )
    return [Hazard(SHARED, what, None, None, None)]


def _run_pass(run, row: Row, p: Pass, sizes: dict, init) -> tuple[list, bool, str | None]:
    """The pass's calls (in a thread of the judge's: nothing here starts a process): its hazards found from the
    outputs (the shared-memory pass), whether the row's call ran to its end, and why not."""
    if p.runner is None:
        return [], False, p.why
    try:
        found = (_shared_calls if p.tool == SHARED else _tool_call)(run, row, p, sizes, init)
        return found, True, None
    except Exception as e:  # the pass could not run it (a build, a call the tool broke, the time limit): said
        return [], False, first_line(e) or type(e).__name__


def _finish(p: Pass, found: list, ran: bool, why: str | None) -> ToolRun:
    """The pass's worker ended (a tool's given time to write its summary), its report read and parsed."""
    code, report = None, ""
    if p.runner is not None:
        p.runner.close(wait_s=END_WAIT_S if p.log else 0.0, echo=False)
        code = p.runner.proc.exitcode
    if p.log:
        try:
            report = Path(p.log).read_text(errors="replace")
        except OSError:
            pass
        try:
            os.unlink(p.log)
        except OSError:
            pass
    hazards = found if p.tool == SHARED else parse_report(report, p.tool)
    return ToolRun(p.tool, p.kind, hazards, ran, why, report, time.perf_counter() - p.t0, code, own=p.tool == SHARED)


def stage_sanitize(run, rec: dict, init) -> None:
    """Every candidate row that passed, under each tool and the shared-memory pass, side by side (see the module
    doc); the record's `sanitize`."""
    if run.device != "cuda":
        run.skip("--sanitize: compute-sanitizer checks GPU kernels, and this judgement runs on the CPU")
        return
    rows = [r for r in run.rows if r.accepted and r.runner.isolated and not r.peer and not r.reference]
    if not rows:
        run.skip("--sanitize: no candidate file's row left to run under compute-sanitizer")
        return
    path = sanitizer_path()
    boxed, why = sandbox.choice(run.sandbox)
    tools = TOOLS if path and boxed else ()
    if path is None:
        run.skip("--sanitize: compute-sanitizer not found (on PATH or in the CUDA toolkit's bin): its tools")
    elif not boxed:
        run.skip(f"--sanitize: compute-sanitizer's tools, which run the candidate in a box of its own ({why})")
    sizes, shape = sanitize_shape(run, rec)
    out = rec["sanitize"] = {"shape": shape, "rows": {}}
    for row in rows:
        if not row.own_kernels:
            run.skip(f"--sanitize: {row.label} ran no kernel of its own: nothing of its own for the tools to check")
            continue
        said = ", ".join([*(t for t, _ in tools), SHARED])
        run.log(
            f"{run.ref.name}: {row.label} under compute-sanitizer and with shared memory filled ({said}) at {shape}"
        )
        passes = [_start_pass(run, row, tool, kind, path) for tool, kind in tools]
        shared = _start_pass(run, row, SHARED, "memory_error", None)
        with ThreadPoolExecutor(len(passes) + 1) as pool:
            made = pool.submit(_shared_made, run, row, shared, sizes, init)
            results = list(pool.map(lambda p: _run_pass(run, row, p, sizes, init), passes))
            unmade = made.result()
        runs = [_finish(p, *r) for p, r in zip(passes, results)]
        # the calls alone on the GPU, the tools' workers ended: another context's kernels between the fill and the
        # call would overwrite the fill (the tools' workers beside it, on an H200, left every fill unseen)
        if unmade is not None:
            found = [], False, unmade
        else:
            with gpu_to_itself(run.log):
                found = _run_pass(run, row, shared, sizes, init)
        _verdict(run, row, [*runs, _finish(shared, *found)], out)


def _verdict(run, row: Row, runs: list[ToolRun], out: dict) -> None:
    """The row's record of its tools, and its rejection at the first tool that saw a hazard in a kernel of its own;
    a tool that could not run it, and hazards in kernels not its own, said."""
    entry = out["rows"][row.label] = {}
    first = None
    for t in runs:
        mine, others = (t.hazards, []) if t.own else own_hazards(t.hazards, row.own_kernels)
        entry[t.tool] = {
            "hazards": len(mine),
            "others": len(others),
            "ran": t.ran,
            "why": t.why,
            "seconds": round(t.seconds, 2),
            "exit_code": t.exit_code,
            "first": mine[0].said() if mine else None,
            "report": t.report[-REPORT_CHARS:],
        }
        run.clock.tally(f"sanitize: {t.tool} (its worker, start to end)", t.seconds)
        if others:
            names = sorted({kernel_base_name(h.kernel) for h in others if h.kernel})
            run.notes.append(
                f"compute-sanitizer {t.tool}: {len(others)} report(s) in kernels not {row.label}'s own "
                f"({', '.join(names[:3]) or 'no kernel named'}): not counted"
            )
        if mine and first is None:
            first = (t, mine)
        elif not mine and not t.ran:
            who = "the shared-memory pass" if t.own else f"compute-sanitizer {t.tool}"
            run.notes.append(f"{who} could not run {row.label}: {t.why}")
    if first is not None:
        t, mine = first
        more = f" (+{len(mine) - 1} more)" if len(mine) > 1 else ""
        row.reject(
            Rejected(
                f"sanitize: {t.tool if t.own else 'compute-sanitizer ' + t.tool}: {mine[0].said()}{more}",
                kind=t.kind,
                check=f"sanitize ({t.tool})",
            )
        )
