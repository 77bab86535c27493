"""Where a run's seconds go inside its stages: the parts of each stage (the record's stage_detail), tallied by one
part of the judge that the stages, the escape check and the checked calls are handed."""

from __future__ import annotations

import contextlib
import time


class StageClock:
    """Seconds by part of a stage ('check: the output against the float64 reference'), added up over the run."""

    def __init__(self):
        self.detail: dict[str, float] = {}

    @contextlib.contextmanager
    def timed(self, what: str):
        """The seconds spent inside the block, added to `what`."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.tally(what, time.perf_counter() - t0)

    def tally(self, what: str, seconds: float) -> None:
        self.detail[what] = self.detail.get(what, 0.0) + seconds

    def largest_first(self) -> dict[str, float]:
        """The detail as the record keeps it: rounded, the largest part first."""
        return {k: round(v, 2) for k, v in sorted(self.detail.items(), key=lambda kv: -kv[1])}
