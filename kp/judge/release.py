"""The judge's cached GPU memory handed back to the device: a candidate's worker shares the GPU with the judge and
needs room for its own."""

from __future__ import annotations

import gc

import torch

from kp.errors import is_cuda_error


def release_cached(room: int = 0, collect: bool = False):
    """Hand cached GPU memory back: a candidate's worker shares the device and needs room for its own. With `room`
    (bytes the job's next steps may ask for), only where the GPU has less than that free: handing back frees every
    cached block, each a device-wide wait behind this process's queued work, and after every checked call that cost
    as much as the checks themselves while other slots' work shared the GPU. With `collect`, Python's garbage
    collector runs first: tensors only reference cycles still hold (an earlier call's, an exception's frames) were
    seen to pin tens of GiB at the largest shapes, more than a retry after an out-of-memory error can spare."""
    if not torch.cuda.is_initialized():
        return
    try:
        if not (room and torch.cuda.mem_get_info()[0] >= room):
            if collect:
                gc.collect()
            torch.cuda.empty_cache()
    except Exception as e:  # a context a sticky fault left unusable (the reference's device-side assert): nothing
        # to hand back, and the fault is said where it was met; raised here, it took the place of that message on its
        # way out through a `finally`'s tidying
        if not is_cuda_error(e):
            raise
