"""The reference run once in a slot's next box before its job comes (kp.batch.prime): the job takes the box with
what it answered and its commands carry on in turn; a box told another job's arguments serves only that job; a run
that cannot get the GPU's gate before its job comes is called off and the judge runs the reference itself."""

import contextlib
import fcntl
import os
import time

import pytest

from conftest import ROOT
from kp.box import builds
from kp.box import sandbox
from kp.judge.clock import StageClock

REF = ROOT / "tests" / "judge_cases" / "relu" / "ref.py"
needs_box = pytest.mark.skipif(sandbox.status()[0] is None, reason=f"no sandbox here: {sandbox.status()[1]}")


def _job(cand, mode="train", seed=7):
    from kp.batch.jobfile import Job

    return Job(("file", str(REF)), str(cand), (("bench", False), ("mode", mode), ("seed", seed)))


def _box_for(cand, spec):
    from kp.box import start as boxstart

    boxstart.start_early(spec, str(cand), later=True)
    (box,) = boxstart.waiting()
    return box


def _args(spec, box, train=True):
    from kp.box.start import worker_args

    return worker_args(spec, "cpu", "fp32", box.env, train)


def _candidate_box(tmp_path):
    """A right candidate's file, the reference, and a box started ahead for the candidate."""
    from kp.judge.reference import Reference

    cand = tmp_path / "cand.py"
    cand.write_text((ROOT / "tests" / "batch" / "good.py").read_text())
    ref = Reference.load(("file", str(REF)))
    return cand, ref, _box_for(cand, ref.spec)


@contextlib.contextmanager
def _a_judge_timing(tmp_path):
    """A GPU lock whose turn another judge holds (it times on the GPU): yields the lock's path."""
    lock = str(tmp_path / "gpu.lock")
    turn = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(turn, fcntl.LOCK_EX)
    try:
        yield lock
    finally:
        os.close(turn)


def _until_made_on_the_host(run):
    t0 = time.monotonic()
    while run.seq < 2 and time.monotonic() - t0 < 60:
        time.sleep(0.1)
    time.sleep(1.0)  # its answer came


@needs_box
def test_a_box_that_ran_the_reference_ahead_is_taken_with_its_answer(tmp_path):
    """The slot's thread tells the box its job, waits for its worker to be up, has the reference's model made on the
    host, then moved and run; the job's runner takes that box, finds the run done with its own arguments, and its
    next command is answered in turn."""
    from kp.batch.prime import RunAhead
    from kp.judge.runners import ProcessRunner

    cand, ref, box = _candidate_box(tmp_path)
    prime_args = (ref.init(), 7, 7)
    run = RunAhead(box, _job(cand), _args(ref.spec, box), prime_args, None)
    run.thread.join(120)
    assert run.reply is not None and run.reply["primed"], run.reply
    from kp.box import start as boxstart

    runner = ProcessRunner(
        ref.spec,
        "cpu",
        "fp32",
        lambda r: None,
        sandbox=True,
        read_only=boxstart.candidate_paths(cand),
        train=True,
        build_dir=str(builds.candidate_build_dir(cand)),
    )
    try:
        assert runner.proc is box.proc and runner.seq == 3  # "ready", "prime_build", then "prime"
        assert runner.ran_ahead(prime_args)["primed"] and runner.made_ahead(prime_args)
        assert runner.ran_ahead((ref.init(), 8, 8)) is None  # another seed: the judge runs it itself
        assert not runner.made_ahead((ref.init(), 8, 8))
        assert runner.call("import", "load", str(cand))["has_model_new"]
    finally:
        runner.close()


@needs_box
def test_a_box_told_another_jobs_arguments_serves_only_that_job(tmp_path):
    """Train and eval of one file have one plan: the box told the eval job's arguments is not taken by the training
    job, which gets a box of its own; the eval job then takes it."""
    from kp.batch.prime import RunAhead, pick
    from kp.box import start as boxstart

    cand, ref, box = _candidate_box(tmp_path)
    eval_args = _args(ref.spec, box, train=False)
    run = RunAhead(box, _job(cand, "eval"), eval_args, (ref.init(), 7, 7), None)
    plan = boxstart.plan_for(ref.spec, cand)
    assert pick([box], plan, _job(cand, "train")) is None and pick([box], plan, _job(cand, "eval")) is box
    paths, build = boxstart.candidate_paths(cand), str(builds.candidate_build_dir(cand))
    train = boxstart.take(ref.spec, paths, build, gpu=False, worker=("cpu", "fp32", True))
    try:
        assert train is not box and boxstart.waiting() == [box] and box.proc.is_alive()
        run.thread.join(120)
        taken = boxstart.take(ref.spec, paths, build, gpu=False, worker=("cpu", "fp32", False))
        assert taken is box and taken.seq == 3 and taken.primed is not None
        taken.discard()
    finally:
        train.discard()


@needs_box
def test_a_run_ahead_waits_for_a_judge_timing_and_is_called_off_when_its_job_comes(tmp_path):
    """Another judge holds the GPU's turn (it times): the run ahead makes the model on the host but does not start
    its GPU work; its job comes, the run is called off, the box is taken having answered that it is up and that the
    model is made, and the judge runs the reference with the model made."""
    from kp.batch.prime import RunAhead
    from kp.box import start as boxstart

    cand, ref, box = _candidate_box(tmp_path)
    with _a_judge_timing(tmp_path) as lock:
        args = _args(ref.spec, box)
        run = RunAhead(box, _job(cand), args, (ref.init(), 7, 7), lock)
        _until_made_on_the_host(run)
        assert run.reply is None and run.thread.is_alive()  # waiting for the gate, not running
        taken = boxstart.take(
            ref.spec,
            boxstart.candidate_paths(cand),
            str(builds.candidate_build_dir(cand)),
            gpu=False,
            worker=("cpu", "fp32", True),
        )
        assert taken is box and taken.seq == 2 and not run.thread.is_alive()
        assert taken.primed[1]["built"] and taken.primed[2] is None  # made on the host, not run: the judge runs it
        taken.discard()


def test_a_shared_stretch_ahead_is_taken_when_free_and_given_up_when_told(tmp_path):
    from kp.lib.gpu_lock import shared_unless

    lock = str(tmp_path / "gpu.lock")
    with shared_unless(lambda: False, lock) as held:
        assert held
        gate = os.open(lock + ".gate", os.O_RDWR)
        with pytest.raises(BlockingIOError):  # held shared: no judge can have the GPU alone meanwhile
            fcntl.flock(gate, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(gate)
    turn = os.open(lock, os.O_RDWR)
    fcntl.flock(turn, fcntl.LOCK_EX)
    try:
        told = time.monotonic() + 0.3
        with shared_unless(lambda: time.monotonic() > told, lock) as held:
            assert not held
    finally:
        os.close(turn)


def test_the_judge_uses_the_run_ahead_only_where_it_ran_with_its_arguments():
    """_ready_worker: a worker whose box ran the reference with the judge's arguments is not asked again; one whose
    run ahead did not match (or never ran) is, told whether its box made the model on the host with them."""
    import types
    from kp.judge.construct import ready_worker

    class Runner:
        isolated = True

        def __init__(self, ahead, made=False):
            self.ahead, self.made, self.calls = ahead, made, []

        def ran_ahead(self, args):
            return self.ahead

        def made_ahead(self, args):
            return self.made

        def call(self, stage, cmd, *args):
            self.calls.append((cmd, args[-1]))
            return {"primed": True}

    j = types.SimpleNamespace(baseline_args=None, prime_args=([4], 7, 7), notes=[], clock=StageClock(), at_sizes={})
    done, fresh, made = Runner({"primed": True, "ok": True}), Runner(None), Runner(None, made=True)
    for r in (done, fresh, made):
        ready_worker(j, r)
    assert done.calls == [] and fresh.calls == [("prime", False)] and made.calls == [("prime", True)]
    assert not j.notes


def test_a_prime_made_on_the_host_is_moved_and_run_and_one_that_could_not_be_made_is_made_on_the_device():
    from kp.judge.reference import Reference
    from kp.worker.setup import SetupCommands
    from kp.worker.state import WorkerState

    ref = Reference.load(("file", str(REF)))
    st = WorkerState(ref, "cpu", "fp32")
    setup = SetupCommands(st)
    assert setup.cmd_prime_build(ref.init(), 7, 7)["built"] and st.prime_built is not None
    assert setup.cmd_prime(ref.init(), 7, 7, True)["primed"] and st.prime_built is None
    assert not setup.cmd_prime_build([object()] * 5, 7, 7)["built"]  # Model(*init) raises: nothing kept
    assert setup.cmd_prime(ref.init(), 7, 7, True)["primed"]


@needs_box
def test_a_run_ahead_waiting_for_the_gate_ends_when_its_box_is_discarded(tmp_path):
    """Its job went to another slot, which discards the box: the run waiting for the gate ends with it, holding
    nothing."""
    from kp.batch.prime import RunAhead
    from kp.box import start as boxstart

    cand, ref, box = _candidate_box(tmp_path)
    with _a_judge_timing(tmp_path) as lock:
        run = RunAhead(box, _job(cand), _args(ref.spec, box), (ref.init(), 7, 7), lock)
        _until_made_on_the_host(run)
        boxstart.discard_early()
        run.thread.join(5)
        assert not run.thread.is_alive() and run.reply is None


@needs_box
def test_a_reference_that_mentions_cuda_is_run_ahead_wholly_under_the_gate(tmp_path):
    """A reference file that mentions CUDA may put its model or inputs on the GPU as it makes them: its run ahead
    makes nothing on the host first (all of it inside the gate); one that does not is made on the host."""
    from kp.batch.jobfile import Job
    from kp.batch.prime import RunAhead, host_made
    from kp.judge.runners import ProcessRunner
    from kp.box import start as boxstart

    gpu_ref = tmp_path / "gpu_ref.py"
    gpu_ref.write_text(REF.read_text() + "\n# get_inputs() could say device='cuda'\n")
    assert host_made(_job(tmp_path / "c.py")) and not host_made(Job(("file", str(gpu_ref)), "c.py", ()))
    assert not host_made(Job(("problem", "softmax"), "c.py", ()))
    cand, ref, box = _candidate_box(tmp_path)
    prime_args = (ref.init(), 7, 7)
    run = RunAhead(box, _job(cand), _args(ref.spec, box), prime_args, None, on_host=False)
    run.thread.join(120)
    runner = ProcessRunner(
        ref.spec,
        "cpu",
        "fp32",
        lambda r: None,
        sandbox=True,
        read_only=boxstart.candidate_paths(cand),
        train=True,
        build_dir=str(builds.candidate_build_dir(cand)),
    )
    try:
        assert runner.seq == 2 and runner.ran_ahead(prime_args)["primed"] and not runner.made_ahead(prime_args)
    finally:
        runner.close()
