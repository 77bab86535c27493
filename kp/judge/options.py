"""The judge's options: one frozen value with every default, checked once when it is made. The command line
(kp.command), a batch's jobs (kp.batch.jobfile), JudgeSession and the warm judge all make this one type, and the
judge (kp.judge.driver) reads it; a job's key is made from its pairs."""

from __future__ import annotations

import dataclasses

from kp.errors import UsageError
from kp.judge.members import member_names, parse_at
from kp.lib.registry import PRECISIONS

MODES = ("train", "eval")
DEVICES = ("cuda", "cpu")
MIN_TRIALS = 3  # parity calls on fresh benchmark-shape inputs, at the least
JOB_TIMEOUT_S = 600  # a candidate's whole job, single run or batch (--timeout): its builds, parity and timing


@dataclasses.dataclass(frozen=True)
class JudgeOptions:
    """How a judgement is made (run.py's flags, in the judge's words). seed None: drawn from the OS. device None:
    the GPU (cuda), where one is visible. shapes: a count of other members of the reference's shape family, or
    members' names (kp.judge.family). at: the shape judged in place of the benchmark's (a
    member of the family, the file's TEST_SIZES or sizes by name, kp.judge.members.parse_at; None: the benchmark's).
    timeout_s: the limit on a candidate's whole job (None: none). sanitize: the candidate's call run under
    compute-sanitizer's tools once it passed (kp.judge.sanitize)."""

    seed: int | None = None
    trials: int = MIN_TRIALS
    precision: str = "fp32"
    device: str | None = None
    bench: bool = True
    compile_baseline: bool = True
    allow_torch: bool = False
    sandbox: bool = True
    profile: bool = False
    ncu: bool = False
    mode: str = "train"
    timeout_s: float | None = JOB_TIMEOUT_S
    shapes: int | tuple[str, ...] = 0
    backward: bool = False
    at: str | None = None
    sanitize: bool = False

    def __post_init__(self):
        if self.mode not in MODES:
            raise UsageError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.precision not in PRECISIONS:
            raise UsageError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if type(self.trials) is not int or self.trials < MIN_TRIALS:
            raise UsageError(f"at least {MIN_TRIALS} trials, got {self.trials}")
        if self.device is not None and self.device not in DEVICES:
            raise UsageError(f"device must be cuda or cpu, got {self.device!r}")
        if self.seed is not None and type(self.seed) is not int:
            raise UsageError(f"seed must be an integer, got {self.seed!r}")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise UsageError(f"timeout must be a positive number of seconds, got {self.timeout_s!r}")
        if isinstance(self.shapes, int):
            if self.shapes < 0:
                raise UsageError(f"--shapes takes a count of other shapes (0 or more), got {self.shapes}")
        else:  # members' names, as the family calls them
            object.__setattr__(self, "shapes", tuple(member_names(self.shapes)))
        object.__setattr__(self, "at", parse_at(self.at))

    @classmethod
    def from_mapping(cls, opts: dict) -> "JudgeOptions":
        """The options a mapping names (a job's, a session's keywords); a name the judge does not take is a
        usage error that lists those it does."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(opts) - known)
        if unknown:
            raise UsageError(f"unknown judge options {unknown}; known: {sorted(known)}")
        return cls(**opts)

    def pairs(self) -> tuple:
        """The options as a job keeps them: sorted (name, value) pairs, a default --shapes, --backward, --at and
        --sanitize left out (a job's key, kp.batch.jobfile.Job.key, is made from them, and a results file written
        before those options existed resumes)."""
        d = dataclasses.asdict(self)
        if not d["shapes"]:
            del d["shapes"]
        for name in ("backward", "at", "sanitize"):
            if not d[name]:
                del d[name]
        return tuple(sorted(d.items()))

    def replace(self, **changes) -> "JudgeOptions":
        return dataclasses.replace(self, **changes)
