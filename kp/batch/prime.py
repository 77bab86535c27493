"""The reference run once in a slot's next box, ahead of its job.

Without timing, a candidate's worker runs the reference once before the candidate's file is imported
(the worker's prime command: its process is then as a user's is after the reference, cuBLAS's handles made and the
kernels' modules loaded). That run was about a second a job, 22% of a warm corpus's job-seconds. A slot starts its next
jobs' boxes while it judges (kp.batch.slots); here the next job's box is also told its job and runs the reference then,
beside the job being judged: first its worker says it is up (the worker's ready command) and makes the reference's model
and inputs on the host (the worker's prime_build command), no lock held; then, to move them to the GPU and call the
model, the run holds the GPU's gate as a shared stretch does (kp.lib.gpu_lock.shared_unless: never while another judge
on the GPU times, and only for that move and call: a judge waiting to time waits for it), and it is called off if its
job comes before it could start. The job takes the box with what it answered (kp.box.start.take, Box.primed), and the
judge uses that run where it ran with the judge's own arguments (kp.judge.runners.ProcessRunner.ran_ahead); otherwise
the judge runs the reference itself, as it does without a slot, moving the model and inputs the box made on the host
where it made them with those arguments (made_ahead) rather than making them again. A reference file that mentions CUDA
may put its model or inputs on the GPU as it makes them: its run ahead does all of it under the gate.
"""

from __future__ import annotations

import contextlib
import pickle
import threading
import time
from pathlib import Path

from kp.batch.jobfile import Job
from kp.worker.loop import REPLY_TIMEOUT_S


class RunAhead:
    """One box's run of the reference ahead of its job, in a thread of the slot: what it answered, and whether the
    conversation went as it should (if not, the box is not used: kp.box.start.take)."""

    def __init__(self, box, job: Job, args: tuple, prime_args: tuple, lock_path: str | None, on_host: bool = True):
        """on_host: the model and inputs are made on the host before the gate is taken (False: a reference that
        may touch the GPU while they are made does all of it under the gate)."""
        self.box, self.job, self.on_host = box, job, on_host
        self.key = pickle.dumps(prime_args)
        self.stop = threading.Event()  # its job has come: no run starts now
        self.ok, self.seq, self.built, self.reply = True, 0, None, None
        box.conn.send(args)
        box.sent, box.early = args, self
        self.thread = threading.Thread(target=self._run, args=(prime_args, lock_path), daemon=True, name="kp-run-ahead")
        self.thread.start()

    def _ask(self, *msg) -> dict | None:
        """One command and its answer; None where the box ended or answered something else."""
        self.box.conn.send(msg)
        self.seq += 1
        while not self.box.conn.poll(0.5):
            if not self.box.proc.is_alive():
                return None
        reply = self.box.conn.recv()
        ok = isinstance(reply, dict) and not reply.get("interim") and reply.get("seq") == self.seq
        return reply if ok else None

    def _called_off(self) -> bool:
        """Its job has come, or its box is gone (the job went to another slot)."""
        return self.stop.is_set() or not self.box.proc.is_alive()

    def _run(self, prime_args: tuple, lock_path: str | None) -> None:
        from kp.lib import gpu_lock

        try:
            if self._ask("ready") is None:
                self.ok = False
                return
            if self.on_host:
                self.built = self._ask("prime_build", *prime_args)
                if self.built is None:
                    self.ok = False
                    return
            gate = (
                gpu_lock.shared_unless(self._called_off, lock_path)
                if lock_path
                else contextlib.nullcontext(not self._called_off())
            )
            with gate as held:
                if not held:
                    return
                self.reply = self._ask("prime", *prime_args, self.on_host)
            self.ok = self.reply is not None
        except Exception:  # the box discarded meanwhile (its job went to another slot), its channel closed
            self.ok = False

    def claim(self, deadline: float | None) -> bool:
        """Its job has come: no run starts now; one under way is waited for (until `deadline`). Whether the box can
        serve the job; if so, what its worker answered is on the box (seq; primed: the run's pickled arguments,
        the answers of its making the model on the host and of its run, None where not asked)."""
        self.stop.set()
        limit = REPLY_TIMEOUT_S if deadline is None else max(0.0, deadline - time.monotonic())
        self.thread.join(limit)
        if self.thread.is_alive() or not self.ok:
            return False
        self.box.seq = self.seq
        self.box.primed = (self.key, self.built, self.reply) if self.seq > 1 else None
        self.box.early = None
        return True


def wanted(job: Job) -> bool:
    """Whether this job's judge runs the reference once in its worker (no timing, on the GPU, a seed given) and its
    box (there is one only where the job is boxed) may run it ahead: at the benchmark's shape, so not with --at."""
    import torch

    opts = dict(job.opts)
    return (
        job.candidate is not None
        and opts.get("bench") is False
        and opts.get("seed") is not None
        and opts.get("device") in (None, "cuda")
        and not opts.get("at")
        and torch.cuda.is_available()
    )


def run_ahead(job: Job, box) -> None:
    """Tell `box` its job and start its run of the reference, as the job's judge would run it (kp.judge.driver:
    the reference in the job's precision, its init inputs, the job's seed for the model and the inputs). Nothing
    is started where the job's judge would not run it, or where anything of this fails (the judge then runs it)."""
    if box.sent is not None or box.early is not None or not wanted(job):
        return
    try:
        from kp.box.start import worker_args
        from kp.judge.reference import Reference
        from kp.lib import gpu_lock

        opts = dict(job.opts)
        precision = opts.get("precision") or "fp32"
        ref = Reference.load(job.ref).use_precision(precision)
        seed = int(opts["seed"])
        args = worker_args(ref.spec, "cuda", precision, box.env, opts.get("mode", "train") == "train")
        RunAhead(box, job, args, (ref.init(), seed, seed), gpu_lock.gpu_lock_path(), on_host=host_made(job))
    except Exception:
        pass


def host_made(job: Job) -> bool:
    """Whether the reference's model and inputs may be made on the host outside the GPU's gate: a reference file
    that does not mention CUDA (one that does may put them on the GPU itself, GPU work that must not run beside a
    judge timing); a built-in problem's file holds its kernels too, and is taken as one that does."""
    if job.ref[0] != "file":
        return False
    try:
        return b"cuda" not in Path(job.ref[1]).read_bytes().lower()
    except OSError:
        return False


def pick(free: list, plan: tuple, job: Job):
    """Of the boxes waiting, one for this job: of its plan, and running the reference ahead for this job or for none
    (a box told another job's arguments serves only that job)."""
    from kp.box.start import fits

    mine = [
        b
        for b in free
        if fits(b, plan) and (b.early is None and b.sent is None or b.early is not None and b.early.job == job)
    ]
    return next((b for b in mine if b.early is not None), mine[0] if mine else None)
