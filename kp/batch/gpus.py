"""The GPUs a batch's slots run on: --gpus as GPU ids of this host, and --slots as how many slots each gets."""

from __future__ import annotations

import os

from kp.errors import UsageError


def gpu_list(spec: str) -> list[str]:
    """'all' -> every visible GPU; '0,1' -> those; a number N -> the first N."""
    import torch

    n = torch.cuda.device_count()
    if spec == "all":
        ids = [str(i) for i in range(n)]
    elif spec.isdigit() and "," not in spec and int(spec) > 0 and spec != "0":
        ids = [str(i) for i in range(int(spec))]
    else:
        ids = [s.strip() for s in spec.split(",") if s.strip()]
    if not ids:
        raise UsageError("--gpus: no GPU visible")
    bad = [i for i in ids if not i.isdigit() or int(i) >= n]
    if bad:
        raise UsageError(f"--gpus: no GPU {', '.join(bad)} here ({n} visible)")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:  # indices are of the visible devices; slots pin the real ones
        real = [v.strip() for v in visible.split(",")]
        ids = [real[int(i)] for i in ids]
    return ids


# measured on H200 hosts of 16 cores a GPU: three slots a GPU judged 83-94% of the time, none waiting for a GPU, each
# GPU 19-22% busy (docs/batch.md); more shared the cores, not the GPU
SLOTS_PER_GPU = 3
CORES_PER_SLOT = 5  # a slot's judge, its candidate's worker and the builds ahead beside them


def slot_list(spec: str, slots: str | None = None) -> list[str]:
    """--gpus and --slots as the slots' GPUs, a GPU once per slot. A --gpus list that names a GPU more than once is
    its own count of slots; otherwise each GPU gets --slots slots, or with auto (the default) SLOTS_PER_GPU where
    the cores this process may use give each slot CORES_PER_SLOT, fewer on a host with fewer cores."""
    ids = gpu_list(spec)
    if len(set(ids)) < len(ids):
        if slots not in (None, "auto"):
            raise UsageError("--slots: the --gpus list names a GPU more than once, which is its own count of slots")
        return ids
    if slots in (None, "auto"):
        per = max(1, min(SLOTS_PER_GPU, len(os.sched_getaffinity(0)) // (CORES_PER_SLOT * len(ids))))
    elif slots.isdigit() and int(slots) > 0:
        per = int(slots)
    else:
        raise UsageError(f"--slots: a number of slots a GPU, or auto, not {slots!r}")
    return [i for i in ids for _ in range(per)]


def cpu_slot_list(slots: str | None = None) -> list[None]:
    """--slots on the CPU (--device cpu): that many CPU slots (None: a slot without a GPU); auto (the default) one,
    since each CPU judgement spreads its own work over the host's cores."""
    if slots in (None, "auto"):
        return [None]
    if slots.isdigit() and int(slots) > 0:
        return [None] * int(slots)
    raise UsageError(f"--slots: a number of CPU slots, or auto, not {slots!r}")
