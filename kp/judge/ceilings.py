"""The judge's ceilings stage: the fewest bytes and FLOPs of a call, the memory it held, the copy bandwidth and GEMM
rates measured in the same run, and the medians that cannot be a call's time (below reading its inputs once at
that bandwidth, or under half the GPU work the profiler saw the same call do) rejected."""

from __future__ import annotations

import torch

from kp.errors import Rejected
from kp.judge.release import release_cached
from kp.judge.plan import free_gpu_bytes, memory_need
from kp.judge.timed import time_rows, traffic
from kp.lib.gpu_lock import gpu_to_itself
from kp.lib.timing import copy_bandwidth, gemm_rates

# A median below this fraction of reading the inputs once at copy speed is impossible, whatever the kernel: generous,
# since part of an input may rightly go unread (a triangular operand's zero half, an index that selects little).
INPUT_FLOOR_FRACTION = 0.25
FLOOR_MIN_MS = 0.005  # floors shorter than this are within the events' own resolution: not judged
# a median under this fraction of the GPU busy time the profiler saw for the same call is not the call's time (clocks
# and noise move one call's time by percents between two runs, not 2x)
BUSY_FRACTION = 0.5


def below_floor(median_ms: float, input_bytes: int, bandwidth: float) -> str | None:
    """Why a median is impossible, or None: below INPUT_FLOOR_FRACTION of the time to read the call's fresh inputs
    once at the copy bandwidth measured in the same run (weights may be cached between calls and FLOPs rewritten
    away, but inputs drawn anew for every call must be read)."""
    floor_ms = INPUT_FLOOR_FRACTION * input_bytes / bandwidth * 1e3
    if floor_ms >= FLOOR_MIN_MS and median_ms < floor_ms:
        return (
            f"timing: median {median_ms * 1e3:.1f} us is below {INPUT_FLOOR_FRACTION:g} x the "
            f"{input_bytes / bandwidth * 1e6:.1f} us it takes to read the inputs once at the copy bandwidth "
            f"measured now ({bandwidth / 1e9:,.0f} GB/s): the reported time is impossible"
        )
    return None


def below_busy(median_ms: float, busy: float | None, what: str = "call") -> str | None:
    """Why a median cannot be the call's time, or None: under BUSY_FRACTION of the time the profiler saw the call's
    own GPU work take in the escape stage (same inputs' shape, L2 flushed the same way). Two honest measurements of
    one call differ by clocks and noise, never by half; a median that small was taken by events that do not bound the
    call (a start event recorded again from inside it). what: "call", or "training step" (--backward's timing)."""
    if busy and busy - median_ms > FLOOR_MIN_MS and median_ms < BUSY_FRACTION * busy:
        timing = "timing" if what == "call" else f"{what} timing"
        return (
            f"{timing}: median {median_ms * 1e3:.1f} us is under {BUSY_FRACTION:g} x the {busy * 1e3:.1f} us "
            f"the profiler saw the {what}'s own GPU work take: the timed events did not bound the {what}"
        )
    return None


_CEILINGS: dict = {}


def _measured(key: tuple, measure):
    """A ceiling measured once per process, GPU and probe size: a batch's slot measures its GPU's copy bandwidth
    and GEMM rates at its first job and keeps them for the rest (the hardware does not change between jobs)."""
    if key not in _CEILINGS:
        _CEILINGS[key] = measure()
    return _CEILINGS[key]


# The stage takes the judge's run (kp.judge.driver.Judge): its escape and timing stages measure again where a
# median is contradicted beside other judges' calls.
def stage_ceilings(run, rec: dict, init) -> None:
    """The traffic, memory and ceilings of the record; a median the call's own profiled work, or the hardware,
    contradicts is rejected."""
    rec["traffic"] = traffic(run, init)
    release_cached()
    peaks = [torch.cuda.max_memory_reserved()]  # before the ceilings' own probe buffers
    for runner in run.runners:
        if runner.isolated:
            try:
                peaks.append(runner.call("memory", "memory")["peak"])
            except Rejected:
                pass
    rec["peak_gpu_bytes"] = sum(peaks)
    rec["memory_need"] = memory_need(run.fp, len(run.rows))
    if run.bench and rec.get("timing"):
        with run.clock.timed("ceilings: copy bandwidth and GEMM rates measured"):
            rec.update(ceilings(run.ref, run.precision, rec["traffic"]["eager"], run.log))
    for row in run.live():  # a time the call's own profiled work, or the hardware, contradicts: not measured
        if row.runner.isolated and row.label in rec.get("timing", {}):
            why = contradicted(rec, row, run.fp["inputs"])
            if why and run.escape_check.beside_other_judges():
                try:  # without timing, both were measured beside other judges' calls: again with the GPU alone
                    with gpu_to_itself(run.log):
                        run.escape_check.check(row)
                        rec.update(time_rows(run))
                except Rejected as e:
                    row.reject(e)
                    continue
                why = contradicted(rec, row, run.fp["inputs"]) if row.accepted else None
            if why:
                row.reject(Rejected(why, kind="timing"))


def contradicted(rec: dict, row, input_bytes: int) -> str | None:
    """Why the row's median cannot be its call's time, or None; under --backward, also why its training step's
    median cannot be the step's (the forward's busy time measured apart, kp.judge.window.forward_busy_ms)."""
    med = rec["timing"][row.label]["median_ms"]
    step = (rec.get("timing_backward") or {}).get(row.label)
    return (
        below_busy(med, (row.escape or {}).get("busy_ms"))
        or ("bandwidth" in rec and below_floor(med, input_bytes, rec["bandwidth"]))
        or (step and below_busy(step["median_ms"], (row.escape or {}).get("busy_step_ms"), "training step"))
        or None
    )


def ceilings(ref, precision: str, traffic: dict, log) -> dict:
    """The ceilings measured now for a reference's call of `traffic` (bytes and FLOPs): device copy bandwidth for
    bytes, and the GEMM rates of the precision for FLOPs when the reference does any; the bound from arithmetic
    intensity unless the file declares it. A GPU short of free memory gets smaller probes, said to `log`."""
    release_cached()
    free = free_gpu_bytes()
    copy_bytes = max(min(4 << 30, int(0.4 * free)) >> 28 << 28, 256 << 20)  # far above L2 either way
    gemm_n = 8192 if 38 * 8192**2 < 0.5 * free else 4096  # 38 n^2 bytes: fp32, fp16, fp64 operands + results
    if copy_bytes < 4 << 30 or gemm_n < 8192:
        log(
            f"{ref.name}: ceilings measured on a {copy_bytes >> 20} MiB copy and {gemm_n}^3 GEMMs: "
            f"{free / 2**30:.1f} GiB of GPU memory free (the GPU is shared)"
        )
    gpu = torch.cuda.current_device() if torch.cuda.is_available() else None
    bw = _measured(("copy", gpu, copy_bytes), lambda: copy_bandwidth(copy_bytes))
    out = {"bandwidth": bw, "flops_rate": None, "rates": {}}
    if traffic.get("flops"):
        out["rates"] = dict(
            _measured(("gemm", gpu, gemm_n, precision), lambda: gemm_rates(n=gemm_n, precision=precision))
        )
        out["flops_rate"] = max(out["rates"].values())
    bound = ref.bound
    if bound is None:
        t_bytes = traffic["bytes"] / bw
        t_flops = traffic["flops"] / out["flops_rate"] if out["flops_rate"] else 0.0
        bound = "compute" if t_flops > t_bytes else "memory"
    out["bound"] = bound
    return out
