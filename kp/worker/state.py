"""What a worker holds while it serves a judge: the reference at its shape, the models under judgement and the
baselines, the factories that build them, what the candidate's import left to compare against, its builds' record,
and the channel a timed call's output reaches the judge through. One object, made by kp.worker.loop.Worker and
passed to each of its command parts (kp.worker.setup, kp.worker.parity_calls, kp.worker.measuring,
kp.worker.profiling): the only state a worker has, so a part's inputs are all here, and a test builds one with what
it needs."""

from __future__ import annotations

from kp.worker.guards import loaded_objects
from kp.worker.replies import send


class WorkerState:
    """ref: the reference (kp.judge.reference.Reference, at the judge's precision); conn: the judge's channel (None
    in the judge's own process); interim: how a timed call's output reaches the judge for checking (default: a round
    trip over conn; in the judge's own process, a plain call)."""

    def __init__(
        self,
        ref,
        device: str,
        precision: str,
        factories: dict | None = None,
        conn=None,
        train: bool = True,
        interim=None,
    ):
        self.ref, self.device, self.precision, self.conn, self.train = ref, device, precision, conn, train
        self.interim = interim or self._interim_pipe
        self.factories = dict(factories or {})
        self.models: dict[str, object] = {}
        self.baselines: dict = {}
        # the candidate's load/load_inline builds that failed, and the seconds inside them
        # (kp.worker.guards.record_build_failures)
        self.build_failures: list[dict] = []
        self.build_seconds = [0.0]
        self.held_inputs = None  # the last two parity calls' inputs (kp.worker.parity_calls)
        self.prime_built = None  # cmd_prime_build's model and inputs, until cmd_prime
        # what the candidate's import is compared against, taken just before it (kp.worker.setup.SetupCommands.load):
        # the namespace's fingerprint, the folder imported from, the threads and the loaded objects before it
        self.fingerprint = None
        self.candidate_dir: str | None = None
        self.threads_before: set = set()
        self.objects_before = loaded_objects()

    def _interim_pipe(self, msg: dict):
        """Hand `msg` to the judge and return its answer."""
        send(self.conn, {"interim": True, **msg})
        return self.conn.recv()[1]

    def with_baselines(self, labels: list[str]) -> dict:
        """The baselines, then the rows of `labels`: what the timer and the profiler run, in the table's order."""
        return {**self.baselines, **{k: self.models[k] for k in labels}}
