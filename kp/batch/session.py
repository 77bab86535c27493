"""A judge a search loop keeps warm in its own process: one reference, slots started once (torch imported, CUDA's
context made, the candidates' boxes started ahead of their jobs), candidates given as files or as source text, and
for each a verdict with the fields of a `--out` record. Each candidate is judged exactly as `run.py --ref REF
--candidate FILE` judges it, in a slot of its own process group (kp.batch.slots); a crash or a hang costs only its
job.

    from kp.batch.session import JudgeSession
    with JudgeSession("ref.py", gpus="0,0,0", allow_torch=True, bench=False) as judge:
        v = judge("cand.py")                       # or judge(source="class ModelNew(...): ...")
        v.status, v.failure, v.speedup, v["verdict"], v.record["rows"]["candidate"]["checks"]
        many = judge.many(["a.py", "b.py"], sources=[src])   # spread over the slots, in the order given
"""

from __future__ import annotations

import tempfile
from collections import deque
from pathlib import Path

from kp.batch.backends import Progress, _drain, _record
from kp.batch.gpus import gpu_list
from kp.batch.jobfile import Job, make_job, status_of, with_reference_seeds
from kp.batch.slots import DEFAULT_TIMEOUT_S, Slot, end_all
from kp.errors import UsageError
from kp.judge.options import JudgeOptions
from kp.lib.registry import problems


class JudgeSession:
    """Warm slots judging candidates against one reference (a file, or a built-in problem id)."""

    def __init__(
        self,
        reference: str | Path,
        gpus: str | None = None,
        slots: int = 1,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        **opts,
    ):
        """gpus: run.py's --gpus ("0,0,0": three slots on GPU 0; "all"); None: `slots` CPU slots (with
        device="cpu") or slots on GPU 0. opts: the judge's options (kp.judge.options.JudgeOptions' fields, its
        defaults where not given), e.g. allow_torch=True, bench=False, device="cpu"."""
        self.opts = JudgeOptions.from_mapping({**opts, "timeout_s": timeout_s})
        ref = str(reference)
        self.ref = ("problem", ref) if ref in problems() else ("file", ref)
        if self.ref[0] == "file" and not Path(ref).is_file():
            raise UsageError(f"reference {ref!r} is neither a file nor a built-in problem")
        cpu = self.opts.device == "cpu"
        where = [None] * slots if cpu else gpu_list(gpus) if gpus else ["0"] * slots
        self.timeout_s = timeout_s
        self.sources = Path(tempfile.mkdtemp(prefix="kp_session_"))  # candidates given as text, one folder each
        self.slots = [(Slot(g, None), f"gpu{g}" if g is not None else f"cpu{i}") for i, g in enumerate(where)]
        self.seed_of: list[dict] = []  # the results so far: every job of the session judged on the reference's seed

    def __call__(self, candidate: str | Path | None = None, *, source: str | None = None) -> dict:
        """One candidate's verdict: a file, or `source`, the text of one."""
        return self.many([candidate] if candidate is not None else [], sources=[source] if source else [])[0]

    def many(self, candidates=(), *, sources=()) -> list[dict]:
        """The verdicts of several candidates (files, then source texts), judged over the slots at once, in the
        order given. Each is a `--out` record's line: ok, verdict, elapsed_s, summary, record (the judge's full
        record), job, gpu."""
        paths = [Path(c) for c in candidates] + [self._file_of(s, i) for i, s in enumerate(sources)]
        for p in paths:
            if not p.is_file():
                raise UsageError(f"candidate file {str(p)!r} does not exist")
        _precompile(paths)
        jobs = with_reference_seeds([make_job(self.ref, p, self.opts) for p in paths], self.seed_of)
        keyed = [(job, f"{i}:{job.key()}") for i, job in enumerate(jobs)]
        results: list[dict] = []
        bar = Progress(len(keyed), enabled=False)
        try:  # each slot starts the boxes of its next jobs while it judges one (kp.batch.backends.ahead)
            _drain(
                deque(keyed),
                self.slots,
                self.timeout_s,
                bar,
                lambda slot, name, job, key, res: _record(None, job, key, res, name, results, _Quiet()),
                spare=len(keyed) <= len(self.slots),
            )  # a loop's call of one or a few: its next versions come next
        finally:
            bar.close()
        self.seed_of += results
        order = {key: i for i, (_, key) in enumerate(keyed)}
        return [Verdict(d) for d in sorted(results, key=lambda d: order[d["key"]])]

    def _file_of(self, source: str, i: int) -> Path:
        """The i-th candidate text of a call as a file alone in its folder, the same file for the i-th text of every
        call, rewritten in place: a loop's next text is the same file's next version, whose box is started ahead
        (kp.box.start: a box is its file's; its builds are kept by contents, the same text the same build)."""
        d = self.sources / str(i)
        d.mkdir(exist_ok=True)
        f = d / "candidate.py"
        if not f.exists() or f.read_text() != source:
            with open(f, "w") as out:  # in place: the same inode, as the box binds it
                out.write(source)
        return f

    def close(self) -> None:
        import shutil

        end_all([slot for slot, _ in self.slots])
        shutil.rmtree(self.sources, ignore_errors=True)

    def __enter__(self) -> "JudgeSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _precompile(paths: list[Path]) -> None:
    """torch's header precompiled for a loop's builds (kp.box.pch), started in the background at the first candidate
    that builds its own extension: that one builds as always, the next ones find it."""
    from kp.batch.ahead import builds_own_extension
    from kp.box import pch

    own = [p for p in paths if builds_own_extension(p)]
    if own:
        try:
            pch.start(pch.variants(own))
        except OSError:
            pass  # the builds parse the header each, as without it


class _Quiet:
    """A Progress that says nothing: the session's caller has the verdicts."""

    def done(self, status: str, line: str) -> None:
        pass


class Verdict(dict):
    """One candidate's result, as a `--out` line holds it (a dict: ok, verdict, record, ...), with the fields a
    loop reads first as attributes: status (accepted, rejected or no_verdict), failure (None, or its kind, stage,
    check and figures), record (the judge's full record, None without a verdict), speedup (against eager, where
    timed)."""

    @property
    def status(self) -> str:
        return status_of(self)

    @property
    def failure(self) -> dict | None:
        return self.get("failure")

    @property
    def record(self) -> dict | None:
        return self.get("record")

    @property
    def speedup(self) -> float | None:
        return (self.get("summary") or {}).get("vs_eager")


__all__ = ["JudgeSession", "Job", "Verdict"]
