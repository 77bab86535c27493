"""Out of GPU memory, whose doing it was: a row's call (rejected where it asked for more than the GPU had free at the
plan, else no verdict where other processes took or held the memory), the judge's own process (no verdict, with
whose memory filled the GPU). Functions of the judge's run (kp.judge.driver.Judge)."""

from __future__ import annotations

from kp.errors import GpuMemoryShort, OutOfMemory, Rejected, first_line
from kp.judge.expected import Row
from kp.judge.plan import (
    CONTEXT_BYTES,
    OTHERS_SLACK,
    float64_peak,
    free_gpu_bytes,
    gpu_snapshot,
    memory_need,
    memory_taken_by_others,
)


def own_oom_reason(
    name: str, stages: list[str], free: int, need: int, others: int | None, workers: int, error: str
) -> str:
    """Why the judge's own process ran out of GPU memory, in one line: after which stages, what was free, and whose
    memory filled the GPU where that was measured (others: bytes other processes took since the plan, None where no
    plan was measured; workers: what the judged models' processes hold)."""
    g = 2**30
    if others is None:
        whose = "whose memory filled the GPU was not measured"
    elif others > OTHERS_SLACK:
        whose = f"other processes took {others / g:.1f} GiB of the GPU during the run"
    else:
        whose = (
            f"no other process took GPU memory during the run: the judge's process and the judged models' "
            f"({workers / g:.1f} GiB) held more than the plan allows"
        )
    return (
        f"{name}: the GPU ran out of memory in the judge's own process after {', '.join(stages) or 'the start'} "
        f"({free / g:.1f} GiB free now; the plan needs {need / g:.1f} GiB): {whose} ({error[:120]})"
    )


# The judge's answers to running out of GPU memory, over its run (kp.judge.driver.Judge).
def out_of_memory(run, row: Row, e: OutOfMemory) -> str:
    """A row's call ran out of GPU memory. If it asked for more than the GPU had free when the plan was made, the
    row is rejected; otherwise, if other processes took memory since, or held more than OTHERS_SLACK beyond the
    CUDA contexts of the judge and its workers when the plan was made, there is no verdict (GpuMemoryShort: how
    much is left beside them depends on them, and a batch judges the job again with the GPU to itself); so too
    where the judge's process and its other rows' workers hold more than the plan allows them (the plan's need,
    and the float64 forward's peak where that runs on the GPU): the judge's excess is not the row's doing. Else
    the row is rejected. The reason says which."""
    if run.gpu_at_plan is None:
        return str(e)
    g, need, free_then = 2**30, memory_need(run.fp, len(run.rows)), run.gpu_at_plan[0]
    mine = e.held if row.runner.isolated else gpu_snapshot()[1]
    if mine + e.asked > free_then:  # whoever else came
        return (
            f"{e}; its process asked for {(mine + e.asked) / g:.1f} GiB in all, more than the "
            f"{free_then / g:.1f} GiB the GPU had free when the judge started"
        )
    workers = workers_held(run.runners, but=row.runner)  # asked once: the judge's other rows' workers
    now = gpu_snapshot()
    others = memory_taken_by_others(run.gpu_at_plan, now, e.held + workers)
    if others > OTHERS_SLACK:
        raise GpuMemoryShort(
            f"{run.ref.name}: {row.label} ran out of GPU memory after other processes took "
            f"{others / g:.1f} GiB of the GPU during the run (the plan found room for "
            f"{need / g:.1f} GiB at its start): no verdict; judge again with the GPU to itself "
            f"({str(e)[:240]})"
        )
    own = CONTEXT_BYTES * (1 + sum(bool(r.isolated) for r in run.runners))  # contexts: ours, our workers'
    if run.others_at_plan > OTHERS_SLACK + own:
        raise GpuMemoryShort(
            f"{run.ref.name}: {row.label} ran out of GPU memory (its process asked for "
            f"{(mine + e.asked) / g:.1f} GiB in all, of the {free_then / g:.1f} GiB free at the "
            f"judge's start) while other processes held {run.others_at_plan / g:.1f} GiB of the "
            f"GPU: no verdict; judge again with the GPU to itself ({str(e)[:240]})"
        )
    if row.runner.isolated:  # the judge's process and its other rows' workers beyond what the plan allows them:
        judges = now[1] + workers  # their excess, not the row's request
        allowed = need + (float64_peak(run.fp, run.backward) if run.f64_device == "cuda" else 0)
        if judges > allowed + OTHERS_SLACK:
            raise GpuMemoryShort(
                f"{run.ref.name}: {row.label} ran out of GPU memory (its process asked for "
                f"{(mine + e.asked) / g:.1f} GiB in all) while the judge's process and its "
                f"other rows' workers held {judges / g:.1f} GiB, beyond the {allowed / g:.1f} "
                f"GiB the plan allows them: no verdict, not the row's doing ({str(e)[:240]})"
            )
    return (
        f"{e}; no other process took GPU memory during the run (nor held any to speak of at its start): "
        f"the row's process held {mine / g:.1f} GiB "
        f"when it asked for more (the judge plans {need / g:.1f} GiB for this problem)"
    )


def workers_held(runners: list, but=None) -> int:
    """GPU bytes the judged models' own processes hold now (each worker asked), but=a runner left out."""
    held = 0
    for runner in runners:  # the workers' memory is the judge's, not another process's
        if runner is not but and runner.isolated:
            try:
                held += int(runner.call("memory", "memory").get("held", 0))
            except (Rejected, TypeError, ValueError):
                pass
    return held


def own_oom(run, e: BaseException, stages: list[str]) -> GpuMemoryShort:
    """The judge's own process out of GPU memory (the plan checked the free memory at its start): no verdict,
    and whose memory it was, measured as for a row: other processes', or the judge's and its workers' own."""
    need = memory_need(run.fp, len(run.rows))
    workers = workers_held(run.runners)
    others = memory_taken_by_others(run.gpu_at_plan, gpu_snapshot(), workers) if run.gpu_at_plan else None
    return GpuMemoryShort(own_oom_reason(run.ref.name, stages, free_gpu_bytes(), need, others, workers, first_line(e)))
