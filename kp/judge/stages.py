"""The judge's stages in the order the driver runs them (kp.judge.driver.Judge.run), and the stage table's rows
that are not stages. A stage is a function of its stage module over the judge's run, the record and the reference's
init arguments; the predicates take the judge's run."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from kp.judge.ceilings import stage_ceilings
from kp.judge.construct import stage_import, stage_setup
from kp.judge.kernelbench import stage_kernelbench
from kp.judge.observe import stage_ncu, stage_profile
from kp.judge.parity_stage import stage_parity
from kp.judge.sanitize import stage_sanitize
from kp.judge.timed import stage_escape, stage_timing


# Stage-table rows that are not stages: the time a stage spent waiting for other judges on its GPU, and the time the
# candidate's own extension builds took (load/load_inline, wherever it calls them), each taken out of its stage.
WAIT_STAGE = "waiting for the GPU"
BUILD_STAGE = "build"


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage of the judge: its name (its key in the record's stage_seconds), the function that runs it, called
    with the judge's run, the record and the reference's init arguments (a failure there rejects a row, through
    Row.reject, or raises for the whole job), and whether it applies to this judge."""

    name: str
    run: Callable[[Any, dict, Any], None]
    applies: Callable[[Any], bool] = lambda judge: True
    # runs GPU work beside other judges' (their checks, never their timing): kp.lib.gpu_lock
    shares_gpu: Callable[[Any], bool] = lambda judge: False


def _on_gpu(judge) -> bool:
    return judge.device == "cuda"


def _always(judge) -> bool:
    return True


def _unless_timing(judge) -> bool:
    """Without timing, nothing of the escape stage on needs the GPU to itself (kp.lib.gpu_lock)."""
    return not judge.bench


# The stages in order. Adding a check is a function in the stage module it belongs to, or a new stage: a function of
# the judge's run in its module and one entry here.
STAGES = (
    # kp.judge.construct: memory plan, float64 placement, baselines
    Stage("setup and baselines", stage_setup, shares_gpu=_always),
    # kp.judge.construct: the candidate's file imported in its worker (its build: the host's work)
    Stage("import", stage_import),
    # kp.judge.parity_stage: construct, the stateful checked calls, derived inputs, the shape family, declared cases
    Stage("parity", stage_parity, shares_gpu=_always),
    # kp.judge.kernelbench: KernelBench's own check, beside the verdict
    Stage("kernelbench check", stage_kernelbench, shares_gpu=_always),
    # kp.judge.timed, with kp.judge.escape's check: work outside the timer, own kernel
    Stage("escape", stage_escape, _on_gpu, _unless_timing),
    # kp.judge.timed (without timing: its checked calls)
    Stage("timing", stage_timing, _on_gpu, _unless_timing),
    # kp.judge.ceilings
    Stage("traffic, memory and ceilings", stage_ceilings, _on_gpu, _unless_timing),
    # kp.judge.observe
    Stage("profile", stage_profile, lambda judge: judge.profile),
)
# After the workers have ended, their candidates' builds put back, to be lent to the workers these stages start:
# kp.judge.sanitize (--sanitize: the candidate's call under compute-sanitizer's tools and with shared memory filled,
# once the own-kernel check named its kernels), kp.judge.observe (--ncu)
AFTER_WORKERS = (
    Stage("sanitize", stage_sanitize, lambda judge: judge.opts.sanitize),
    Stage("ncu", stage_ncu, lambda judge: judge.ncu and _on_gpu(judge)),
)
