"""The candidate's worker: how a failed call is answered (out of GPU memory, a fault of its GPU work), and the
state the worker is put in before the candidate's file is imported."""

import re
from pathlib import Path

import pytest

from kp.worker.replies import FAULTED, fault_text, raised


def test_out_of_gpu_memory_says_what_the_gpu_has_free():
    """A candidate's call that runs out of GPU memory is rejected, and the reason says what the GPU has free, since
    on a shared GPU the memory of other processes counts against it; any other error is said as it was."""
    from kp.worker.replies import raised

    oom = raised(
        "trial 2 (seed 7)",
        "OutOfMemoryError: CUDA out of memory. Tried to allocate 12.06 GiB",
        gpu_memory=lambda: (1 << 30, 80 << 30),
    )
    assert oom.startswith("trial 2 (seed 7): raised OutOfMemoryError") and "1.0 of 80.0 GiB free now" in oom
    other = raised("trial 1", "ValueError: bad shape", gpu_memory=lambda: (1, 2))
    assert other == "trial 1: raised ValueError: bad shape"


def test_a_fault_in_the_candidates_gpu_work_is_named_as_the_fault():
    """A call whose GPU work faulted (an illegal address, sticky) is answered with the fault, not with the later
    library call where CUDA reported it; where the call raised the fault itself, it is said once."""
    sym = "RuntimeError: CUDA error: CUBLAS_STATUS_INTERNAL_ERROR when calling `cublasCreate(handle)`"
    fault = "CUDA error: an illegal memory access was encountered"
    text = fault_text(fault, sym)
    assert text.startswith(f"{FAULTED} in this call: {fault}") and f"it surfaced as {sym}" in text
    why = raised("trial 1 (seed 1)", text)
    assert why.startswith("trial 1 (seed 1): its GPU work faulted in this call: CUDA error: an illegal memory"), why
    same = fault_text(fault, f"AcceleratorError: {fault}")
    assert "surfaced" not in same and same.count("illegal memory access") == 1


class _Runner:
    def __init__(self, isolated, primed=True):
        self.isolated, self.primed, self.calls = isolated, primed, []

    def call(self, stage, cmd, *args):
        self.calls.append(cmd)
        return {"primed": self.primed, "why": None if self.primed else "OutOfMemoryError: CUDA out of memory"}


def _judge(bench: bool):
    """The part of a judge's run that readies a worker reads: what builds the baselines (timed) or runs the
    reference once (untimed), the notes, the clock and the --at sizes."""
    import types
    from kp.judge.clock import StageClock

    return types.SimpleNamespace(
        notes=[],
        clock=StageClock(),
        at_sizes={},
        baseline_args=("init", 1, {}, False, 1) if bench else None,
        prime_args=None if bench else ("init", 1, 1),
    )


def test_the_reference_runs_in_the_candidates_worker_before_its_import():
    """Timed, the baselines run in every worker (the reference's first call there); untimed, a candidate's worker
    runs the reference once and drops it (a library's first use then is not inside the candidate's first call, as
    in a user's process); the judge's own in-process runner needs neither. A reference that cannot run there is said
    in the notes, not a failure of the candidate."""
    from kp.judge.construct import ready_worker

    timed, untimed, local, short = _Runner(True), _Runner(True), _Runner(False), _Runner(True, primed=False)
    ready_worker(_judge(True), timed)
    assert timed.calls == ["baselines"]
    j = _judge(False)
    for r in (untimed, local):
        ready_worker(j, r)
    assert untimed.calls == ["prime"] and local.calls == [] and not j.notes
    ready_worker(j, short)
    assert short.calls == ["prime"] and len(j.notes) == 1 and "could not run in the candidate's process" in j.notes[0]


def test_prime_runs_the_reference_alone_and_says_when_it_cannot(tmp_path):
    """cmd_prime builds the reference's Model, calls it once and keeps nothing; a reference that raises there is
    answered with why, not raised (the judge's own run of it reports a broken reference)."""
    from kp.judge.reference import Reference
    from kp.worker.setup import SetupCommands
    from kp.worker.state import WorkerState

    ref = Path(__file__).parent / "judge_cases" / "contract" / "graphs" / "ref.py"
    st = WorkerState(Reference.load(("file", str(ref))), "cpu", "fp32")
    setup = SetupCommands(st)
    assert setup.cmd_prime([512, 384], 1, 2) == {"primed": True} and not st.models and not st.baselines
    bad = setup.cmd_prime([7, 384], 1, 2)  # a layer 7 wide: the inputs are 512 wide
    assert bad["primed"] is False and bad["why"].startswith("RuntimeError"), bad


def test_timing_the_candidates_builds_changes_nothing_the_fingerprint_guards(monkeypatch):
    """The seconds a candidate spends in load/load_inline are counted where the namespace fingerprint does not
    look (a list the worker owns), so a candidate that builds is not taken for one that patches the judge."""
    from torch.utils import cpp_extension as ext
    from kp.worker.guards import fingerprint_changes, namespace_fingerprint, record_build_failures

    monkeypatch.setattr(ext, "load_inline", lambda *a, **k: "built")
    monkeypatch.setattr(ext, "load", lambda *a, **k: "built")
    sink, seconds = [], [0.0]
    record_build_failures(sink, seconds)
    before = namespace_fingerprint()
    assert ext.load_inline(name="x") == "built" and ext.load(name="y") == "built"
    assert seconds[0] > 0 and sink == [] and fingerprint_changes(before) == []


def test_a_build_that_failed_in_another_process_is_said_with_its_compiler_error(monkeypatch, tmp_path):
    """A batch builds a candidate's extension ahead while its slot may reach it: the slot's load waits for the
    build's lock and finds no library when that build failed. The compiler's error, which the failing build left in
    its folder, is what the slot says (as a build error), not the missing library."""
    import pytest
    from torch.utils import cpp_extension as ext
    from kp.worker.guards import BUILD_FAILED, record_build_failures

    def failing(*a, **k):
        raise RuntimeError("Error building extension 'x':\nkernel.cu(59): error: no suitable conversion function")

    def missing(*a, **k):
        raise ImportError(f"{k['build_directory']}/x.so: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(ext, "load_inline", failing)
    monkeypatch.setattr(ext, "load", missing)
    sink = []
    record_build_failures(sink)
    with pytest.raises(RuntimeError):
        ext.load_inline(name="x", build_directory=str(tmp_path))
    assert (tmp_path / BUILD_FAILED).read_text() == "kernel.cu(59): error: no suitable conversion function"
    with pytest.raises(RuntimeError, match=r"Error building extension 'x' \(built in another process\): kernel.cu"):
        ext.load(name="x", build_directory=str(tmp_path))
    assert sink[-1] == {
        "extension": "x",
        "error": "kernel.cu(59): error: no suitable conversion function",
        "cuda": False,
    }


def test_a_call_after_the_worker_ended_for_a_gpu_fault_says_so(tmp_path):
    """A worker whose call faulted answers it, says why on its stderr and ends (exit code 0); a later command of the
    judge's (the KernelBench column) names that, not an unexplained exit."""
    from kp.worker.replies import ENDED_AFTER_FAULT
    from kp.judge.runners import died, stderr_tail

    err = tmp_path / "stderr"
    err.write_text(f"{ENDED_AFTER_FAULT} after 'forward' (CUDA error: misaligned address); this process ends here\n")
    e = died("kernelbench check", 0, stderr_tail(str(err)))
    why = str(e)
    assert why.startswith("kernelbench check: the candidate's process had ended after its GPU work faulted")
    assert "misaligned address" in why and "os._exit" not in why and e.kind == "crash"
    below = str(died("forward", 0, ""))  # exit 0 with nothing said: the process left below Python
    assert "os._exit" in below and below.endswith("nothing on its stderr")
    assert "(signal 9, SIGKILL)" in str(died("forward", -9, ""))


def test_a_verbose_build_that_fails_is_said_with_the_compilers_error(tmp_path, monkeypatch):
    """Machine-written candidates build with verbose=True, where torch prints the compiler's output and raises a bare
    `Error building extension`: the judge builds them quietly, so the error carries the compiler's line."""
    import pytest
    from torch.utils import cpp_extension as ext
    from kp.worker.guards import record_build_failures

    monkeypatch.setattr(ext, "load", ext.load)  # put back after: the wrapper below replaces it
    monkeypatch.setattr(ext, "load_inline", ext.load_inline)
    src = tmp_path / "broken.cpp"
    src.write_text("dim3 grid(1);  // host launch code in a C++ file: dim3 is not declared here\n")
    sink = []
    record_build_failures(sink)
    with pytest.raises(RuntimeError):
        ext.load(name="broken_ext", sources=[str(src)], build_directory=str(tmp_path), verbose=True)
    assert "dim3" in sink[-1]["error"] and "error" in sink[-1]["error"], sink


@pytest.mark.parametrize("boxed", [True, False], ids=["boxed", "unboxed"])
def test_a_candidates_output_is_capped_with_its_cut_said(cli, boxed):
    """5 MiB to each stream at every call, over a dozen calls: what reaches the judge's output is its start and its
    end (kp.worker.loop.cap_output), the cut said; the verdict is unchanged."""
    from kp.box import sandbox
    from kp.worker.loop import OUTPUT_HEAD, OUTPUT_TAIL

    if boxed and sandbox.status()[0] is None:
        pytest.skip(f"no sandbox here: {sandbox.status()[1]}")
    root = Path(__file__).resolve().parent
    r = cli(
        "--ref",
        root / "judge_cases" / "relu" / "ref.py",
        "--candidate",
        root / "output" / "loud.py",
        "--device",
        "cpu",
        "--allow-torch",
        *([] if boxed else ["--no-sandbox"]),
    )
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1].startswith("accepted"), r.stdout[-2000:]
    assert len(r.stdout) + len(r.stderr) < 2 * (OUTPUT_HEAD + OUTPUT_TAIL), (len(r.stdout), len(r.stderr))
    assert re.search(r"\[\.\.\. at least [\d,]+ bytes of the candidate's output cut \.\.\.\]", r.stderr)
    assert "[kp] the candidate's output (its process's stdout and stderr):\n" in r.stderr
    assert r.stderr.count("[kp] end of the candidate's output") == 1


def test_the_judge_cuts_a_candidates_output_at_line_ends():
    from kp.worker.loop import cut_middle

    data = b"".join(b"line %05d of the candidate\n" % i for i in range(5000))
    shown = cut_middle(data, head=1000, tail=1000).split(b"\n")
    cut = next(i for i, ln in enumerate(shown) if ln.startswith(b"[... at least"))
    assert all(ln.startswith(b"line ") and ln.endswith(b"of the candidate") for ln in shown[:cut] + shown[cut + 1 : -1])
    assert shown[0] == b"line 00000 of the candidate" and shown[-2] == b"line 04999 of the candidate"
    one = b"x" * 10000  # a line longer than the head and the tail: cut where it must be
    assert len(cut_middle(one, head=1000, tail=1000)) < 2100


def test_weights_torch_refuses_are_said_as_data_and_the_candidates_own_raise_is_its_own():
    """The worker's load_weights command: torch's load_state_dict refusing the reference's tensors (here a buffer
    that is an expanded view, which no copy can write) is a reply the judge reads ({"loaded": False, "why"}), so
    the row keeps its same-seed initialisation; an exception of the candidate's own code while loading is raised,
    as any call's."""
    import torch

    from kp.judge.reference import Reference
    from kp.worker.setup import SetupCommands
    from kp.worker.state import WorkerState

    class Expanded(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("scale", torch.ones(1).expand(4))

    class Hook(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(4))

        def _load_from_state_dict(self, *a, **k):
            raise ValueError("the candidate's own loader")

    ref = Path(__file__).parent / "batch" / "ref.py"
    st = WorkerState(Reference.load(("file", str(ref))), "cpu", "fp32")
    st.models = {"expanded": Expanded(), "hook": Hook()}
    setup = SetupCommands(st)
    said = setup.cmd_load_weights("expanded", {"scale": torch.full((4,), 2.0)})
    assert said["loaded"] is False and "loading state_dict" in said["why"], said
    with pytest.raises(ValueError, match="own loader"):
        setup.cmd_load_weights("hook", {"w": torch.ones(4)})
