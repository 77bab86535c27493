"""The judge's plan before any work: the GPU memory a problem needs for the judge and its models, and on the CPU
whether benchmark-shape calls can run in the host's memory at all."""

from __future__ import annotations

import os
from pathlib import Path

from kp.errors import GpuMemoryShort

MEMORY_FACTOR = 3  # the judge's peak GPU memory target: this many times the problem's inputs + outputs + weights
# GPU bytes the float64 reference needs: its forward's fp32 peak (LivePeak: inputs, weights, intermediates) twice over
# in float64, and 15% for the allocator's rounding and the comparison's chunks
FLOAT64_PEAK_FACTOR = 2.3
CPU_SHARE = 0.75  # on --device cpu, the part of the host's available memory a judge plans its calls in


def widen(fp: dict) -> float:
    """How many times larger the float64 reference's tensors are than the judged ones: 2 from fp32, 4 from the
    16-bit dtypes (the footprint's `float_bytes`: the floating inputs' element size in the judged precision)."""
    return 8 / fp.get("float_bytes", 4)


def float64_peak_factor(fp: dict) -> float:
    """FLOAT64_PEAK_FACTOR for the judged dtype: the float64 forward's bytes over the judged forward's peak (its
    2 x from fp32, widened again from a 16-bit dtype)."""
    return FLOAT64_PEAK_FACTOR * widen(fp) / 2


def host_available() -> int:
    """Bytes of host memory available now (MemAvailable), or all of it where that cannot be read."""
    try:
        for ln in Path("/proc/meminfo").read_text().splitlines():
            if ln.startswith("MemAvailable:"):
                return int(ln.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def host_budget() -> int:
    """Bytes of host memory a judge on the CPU plans its calls in: KP_CPU_MEMORY where set (the test suite bounds
    each of its parallel judges with it), else CPU_SHARE of what the host has available now."""
    set_to = os.environ.get("KP_CPU_MEMORY")
    return int(float(set_to)) if set_to else int(CPU_SHARE * host_available())


def cpu_need(fp: dict, backward: bool = False) -> int:
    """Host bytes a benchmark-shape call holds at once on the CPU, the judge's own copies counted: the fp32
    reference's forward and its float64 copy (the forward's peak, LivePeak, once and widened: 2 x from fp32, 4 x from
    fp16/bf16), the candidate's forward in its worker (its peak again), and the candidate's copy of the inputs and
    the output it hands back. With `backward`, the gradients beside them: the upstream, input and weight gradients
    of the fp32 reference, of the candidate and, widened, of the float64 reference."""
    forward = (2 + widen(fp)) * fp.get("peak", footprint_bytes(fp)) + fp["inputs"] + fp["outputs"]
    grads = (2 + widen(fp)) * footprint_bytes(fp) if backward else 0
    return int(forward + grads)


def cpu_bench_refusal(fp: dict, budget: int, what: str = "the benchmark shape", backward: bool = False) -> str | None:
    """Why `what` (a shape with footprint fp) is not run on the CPU (cpu_need over the host's budget, its
    gradients counted with `backward`), or None."""
    need = cpu_need(fp, backward)
    if need <= budget:
        return None
    io = fp["inputs"] + fp["outputs"]
    return (
        f"{what} needs about {need / 2**30:.1f} GiB of host memory with the judge's copies"
        + (" and the gradients " if backward else " ")
        + f"(inputs and outputs {io / 2**30:.1f} GiB, a forward's peak {fp.get('peak', 0) / 2**30:.1f} GiB), "
        f"{budget / 2**30:.1f} GiB planned here"
    )


def footprint_bytes(fp: dict) -> int:
    """The problem's inputs, outputs and weights, in bytes: what the plan multiplies."""
    return fp["inputs"] + fp["outputs"] + fp["weights"]


def free_gpu_bytes() -> int:
    """GPU memory free now, the figure the plan and the ceilings' probe sizes are made from."""
    import torch

    return torch.cuda.mem_get_info()[0]


# How much the GPU memory of the judge's own processes may grow outside PyTorch's allocators during a run (a worker's
# CUDA context, about 0.5 GiB, created after the plan; library handles and workspaces): below this, memory the GPU
# lost is not said to be another process's.
OTHERS_SLACK = 2 << 30


def gpu_snapshot() -> tuple[int, int]:
    """(bytes the GPU has free, bytes this process's allocator holds) now: taken with the plan and again when a call
    runs out of memory, to tell whose memory filled the GPU."""
    import torch

    return torch.cuda.mem_get_info()[0], torch.cuda.memory_reserved()


# One process's CUDA context with torch's kernels loaded, as it shows in the GPU's used memory: boxes started ahead
# by a batch slot took 2.8 GiB for three on an H100 (torch 2.11, CUDA 13).
CONTEXT_BYTES = 1 << 30


def held_by_others(snapshot: tuple[int, int]) -> int:
    """GPU bytes neither free nor in this process's allocator at a gpu_snapshot(): other processes' memory, and every
    CUDA context's (this process's and its workers' included: about CONTEXT_BYTES each)."""
    import torch

    free, reserved = snapshot
    return torch.cuda.mem_get_info()[1] - free - reserved


def memory_taken_by_others(then: tuple[int, int], now: tuple[int, int], workers_held: int) -> int:
    """Bytes of GPU memory that processes other than the judge and its workers took between two gpu_snapshot()s:
    what the GPU lost beyond the judge's own allocator's growth and what its workers' allocators hold now (they
    held none when the plan was made)."""
    return (then[0] - now[0]) - (now[1] - then[1]) - workers_held


def memory_need(fp: dict, models: int) -> int:
    """GPU bytes the judge plans for: MEMORY_FACTOR x the problem's inputs, outputs and weights (the model's copy of
    the inputs, its output, PyTorch's output, the timing pool, the references' weights), plus one copy of the
    weights for each judged model beyond the first (every row is alive while rows are timed side by side)."""
    return MEMORY_FACTOR * footprint_bytes(fp) + max(models - 1, 0) * fp["weights"]


def float64_peak(fp: dict, backward: bool = False) -> int:
    """GPU bytes the float64 reference takes at its peak: its forward's, the fp32 forward's widened; with
    `backward`, its backward's: the forward's tensors autograd keeps for it, and beside them the upstream gradient
    and the gradients of the inputs and the weights, each widened (the softmax's float64 backward at its benchmark
    shape peaks at 42 GiB where its forward takes 28)."""
    forward = float64_peak_factor(fp) * fp.get("peak", footprint_bytes(fp))
    grads = widen(fp) * footprint_bytes(fp) if backward else 0
    return int(forward + grads)


def float64_on_gpu(fp: dict, models: int, free: int, backward: bool = False) -> tuple[bool, str]:
    """Whether the float64 reference runs on the GPU, and why in words for the record: it does whenever the
    plan's need and the float64 reference's peak (its backward's with `backward`) fit in what the GPU has free (a
    problem of a few GB then takes seconds where the host takes minutes); otherwise on the host."""
    need = memory_need(fp, models)
    f64 = float64_peak(fp, backward)
    where = (
        f"{(need + f64) / 2**30:.1f} GiB needed with the float64 {'backward' if backward else 'forward'}'s peak "
        f"of {f64 / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
    )
    return need + f64 <= free, where


def float64_chunks(fp: dict, models: int, free: int) -> int:
    """Where the float64 forward's whole peak does not fit beside the plan: the fewest slices of the batch (a power
    of two, at most the batch's rows) it fits in on the GPU, holding its whole float64 output (twice PyTorch's fp32
    output, four times a 16-bit one) and one slice's forward (the weights whole, the rest of the peak shared out); 0
    where none fits or the inputs share no batch dimension. Whether the forward may be sliced is proved on its first
    call (kp.judge.expected._Refs)."""
    rows, peak = fp.get("rows", 0), fp.get("peak", footprint_bytes(fp))
    held = memory_need(fp, models) + widen(fp) * fp["outputs"]
    factor = float64_peak_factor(fp)
    n = 2
    while n <= rows:
        if held + factor * ((peak - fp["weights"]) / n + fp["weights"]) <= free:
            return n
        n *= 2
    return 0


def check_memory(name: str, fp: dict, models: int, free: int) -> None:
    """One line before any work when the judge would not fit."""
    need = memory_need(fp, models)
    fbytes = footprint_bytes(fp)
    if need > free:
        raise GpuMemoryShort(
            f"{name} needs about {need / 2**30:.1f} GiB of GPU memory ({MEMORY_FACTOR} x "
            f"{fbytes / 2**30:.1f} GiB of inputs, outputs and weights"
            + (f", and the weights of {models} models" if models > 1 and fp["weights"] else "")
            + f"); {free / 2**30:.1f} GiB are free"
        )
