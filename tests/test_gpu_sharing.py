"""Judges sharing a GPU: the GPU held alone only where a clock another process's kernels lengthen is read (the timing
stage, its ceilings, the escape profile a median is held against), a judge waiting to time waiting for one call of
the others, not their stages, and the wait moving a judge's deadline rather than counting against its job
(kp.lib.gpu_lock)."""

import types

import pytest

from cases import CASES_DIR
from kp.judge import driver as judge


def test_timing_holds_the_gpu_against_other_judges(monkeypatch, tmp_path):
    """Two judges sharing a GPU time one at a time: the second waits (and says so) until the first lets go."""
    import fcntl
    import os
    from kp.lib import gpu_lock

    monkeypatch.setattr(gpu_lock, "gpu_lock_path", lambda: str(tmp_path / "gpu.lock"))
    said = []
    with gpu_lock.gpu_to_itself(said.append):
        fd = os.open(tmp_path / "gpu.lock", os.O_RDWR)
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # let go on leaving; now held by "another judge"
    import threading

    threading.Timer(0.3, os.close, (fd,)).start()
    with gpu_lock.gpu_to_itself(said.append):  # waits until the other lets go
        pass
    assert said[0].startswith("waiting for the GPU") and said[1].startswith("GPU free after")


def test_no_judge_times_while_another_is_in_a_gpu_stage(monkeypatch, tmp_path):
    """Judges sharing a GPU: a judge about to time waits until the stages other judges are in (parity, KernelBench's
    check) end; a stage asked for after it waits until its timing ends, so its times see no other judge's kernels;
    every wait is told (a judge moves its deadline by it, a batch slot its limit)."""
    import threading
    import time
    from kp.lib import gpu_lock

    monkeypatch.setattr(gpu_lock, "gpu_lock_path", lambda: str(tmp_path / "gpu.lock"))
    told, events = [], []
    monkeypatch.setattr(gpu_lock, "GPU_WAITS", [told.append])
    in_stage, leave_stage = threading.Event(), threading.Event()

    def judge_in_parity():
        with gpu_lock.gpu_shared():
            events.append("A in parity")
            in_stage.set()
            leave_stage.wait(5)
            events.append("A leaves parity")

    def judge_starting_parity():
        with gpu_lock.gpu_shared():
            events.append("C in parity")

    a = threading.Thread(target=judge_in_parity)
    a.start()
    in_stage.wait(5)
    with gpu_lock.gpu_shared():  # two judges' stages side by side: no wait
        events.append("D in parity beside A")
    c = threading.Thread(target=judge_starting_parity)
    threading.Timer(0.3, c.start).start()  # asks for its stage while B waits to time
    threading.Timer(0.6, leave_stage.set).start()
    with gpu_lock.gpu_to_itself():
        events.append("B times")
        time.sleep(0.3)
        events.append("B done")
    a.join(5)
    c.join(5)
    assert events == ["A in parity", "D in parity beside A", "A leaves parity", "B times", "B done", "C in parity"]
    assert len(told) == 2 and told[0] > 0.4 and told[1] > 0.2  # B waited for A's stage, C for B's timing


def test_a_judge_waiting_to_time_waits_for_one_call_not_a_whole_stage(monkeypatch, tmp_path):
    """A judge in a long shared stage pulses before each command it sends: a judge asking to time gets the GPU at
    the next pulse, and the stage goes on after that judge's timing (its wait told like any other)."""
    import threading
    import time
    from kp.lib import gpu_lock

    monkeypatch.setattr(gpu_lock, "gpu_lock_path", lambda: str(tmp_path / "gpu.lock"))
    told, events = [], []
    monkeypatch.setattr(gpu_lock, "GPU_WAITS", [told.append])
    started, stop = threading.Event(), threading.Event()

    def long_parity():
        with gpu_lock.gpu_shared():
            started.set()
            for call in range(200):  # a 10 s stage of 50 ms calls
                gpu_lock.pulse()
                events.append(("A call", time.perf_counter()))
                if stop.is_set():
                    return
                time.sleep(0.05)

    a = threading.Thread(target=long_parity)
    a.start()
    started.wait(5)
    time.sleep(0.2)
    t_ask = time.perf_counter()
    with gpu_lock.gpu_to_itself():
        t_in = time.perf_counter()
        time.sleep(0.3)
        t_out = time.perf_counter()
    time.sleep(0.2)
    stop.set()
    a.join(5)
    assert t_in - t_ask < 0.5  # one call's length, not the stage's 10 s
    assert not [t for what, t in events if t_in < t < t_out]  # no call of A while B timed
    assert [t for what, t in events if t > t_out]  # A's stage went on after
    assert told and max(told) > 0.2  # A's wait behind B's timing, told


def test_a_judge_holding_the_gpu_alone_takes_it_again_without_waiting_for_itself(monkeypatch, tmp_path):
    """The GPU taken alone inside a hold of the same thread (a median measured again with the GPU alone, whose escape
    try asks for it too) is already held, and the commands sent to workers inside it pulse the thread's shared
    stretch, which has nothing to wait for: no wait on its own locks (a GPU batch once waited for itself there until
    the job's time limit)."""
    import threading
    from kp.lib import gpu_lock

    monkeypatch.setattr(gpu_lock, "gpu_lock_path", lambda: str(tmp_path / "gpu.lock"))
    done = threading.Event()

    def nested():
        with gpu_lock.gpu_shared():
            with gpu_lock.gpu_to_itself():
                gpu_lock.pulse()  # a command sent to a worker inside the hold: its share waits for nobody
                with gpu_lock.gpu_to_itself():
                    gpu_lock.pulse()
            gpu_lock.pulse()
        done.set()

    threading.Thread(target=nested, daemon=True).start()
    assert done.wait(10)


def test_a_judge_waiting_for_the_gpu_moves_its_deadline():
    ref = judge.Reference.load(("file", str(CASES_DIR / "relu" / "ref.py")))
    j = judge.Judge(ref, seed=3, device="cpu", sandbox=False, bench=False, timeout_s=100)

    class Runner:
        deadline = 50.0

    j.runners = [Runner(), judge.LocalRunner.__new__(judge.LocalRunner)]
    before = j.deadline
    j._waited_for_gpu(7.5)
    assert j.deadline == before + 7.5 and j.runners[0].deadline == 57.5 and j.gpu_wait_s == 7.5
    assert [s.name for s in judge.STAGES if s.shares_gpu(j)] == [  # without timing: no stage holds the GPU alone
        "setup and baselines",
        "parity",
        "kernelbench check",
        "escape",
        "timing",
        "traffic, memory and ceilings",
    ]
    j.bench = True
    assert [s.name for s in judge.STAGES if s.shares_gpu(j)] == ["setup and baselines", "parity", "kernelbench check"]


def test_a_median_under_the_profiled_time_beside_other_judges_is_measured_again_alone(monkeypatch):
    """Without timing, the escape profile and the short timed check share the GPU with other judges: a median under
    half the profiled time is measured again (both) with the GPU to itself, and that decides. A start event re-recorded
    from inside the call stays under it and is rejected; an honest call slowed beside others is accepted."""
    import contextlib
    from kp.judge import ceilings
    from kp.judge.clock import StageClock

    @contextlib.contextmanager
    def to_itself(log=None):
        alone.append(True)
        yield

    monkeypatch.setattr(ceilings, "gpu_to_itself", to_itself)
    for alone_median, accepted in ((0.01, False), (0.9, True)):
        alone = []
        row = judge.Row("candidate", types.SimpleNamespace(isolated=True, call=lambda *a, **k: {"peak": 0}))
        row.escape = {"busy_ms": 1.0}
        run = types.SimpleNamespace(  # what the stage reads of the judge's run, and nothing else
            device="cuda",
            bench=False,
            rows=[row],
            live=lambda: [r for r in [row] if r.accepted],
            runners=[],
            log=lambda said: None,
            fp={"inputs": 4, "outputs": 4, "weights": 0, "flops": 0},
            ref=types.SimpleNamespace(inputs=lambda *a: [], traffic=lambda *a, **k: {"bytes": 8, "flops": 0}),
            seed=1,
            precision="fp32",
            clock=StageClock(),
            escape_check=types.SimpleNamespace(check=lambda r: None, beside_other_judges=lambda: True),
        )
        monkeypatch.setattr(ceilings, "time_rows", lambda run: {"timing": {"candidate": {"median_ms": alone_median}}})
        rec = {"timing": {"candidate": {"median_ms": 0.01}}}
        monkeypatch.setattr(ceilings, "memory_need", lambda *a: 0)
        ceilings.stage_ceilings(run, rec, [])
        assert alone == [True] and row.accepted is accepted, row.reason
