"""CUDA's driver and the first visible GPU's context started in a thread of their own, before torch is imported.

A box started ahead of its job (`kp.box.entry ... cuda`) imports torch and then makes CUDA's context: one after the
other, the two are most of its start (about 5.7 s to a working context on an H200), and a single command waits for
that box. The context is the driver's (cuInit, then the device's primary context, which the runtime torch calls
uses as its own): made through the driver's library directly it needs no torch, so it runs beside torch's import,
and torch's first CUDA call finds it made. Nothing here raises: without a driver or a GPU the thread ends and torch
meets CUDA as it always did. Only for a process that forks nothing afterwards (a child forked after the driver
starts cannot use it). KP_CUDA_EARLY=0 turns it off."""

from __future__ import annotations

import ctypes
import os
import threading


def start() -> threading.Thread | None:
    """The thread making the driver's context, started; None where turned off."""
    if os.environ.get("KP_CUDA_EARLY", "1") == "0":
        return None
    t = threading.Thread(target=_make, name="kp-cuda-early", daemon=True)
    t.start()
    return t


def _make() -> bool:
    """Whether the first visible GPU's primary context was made (and is kept: torch's runtime takes it over)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        return (
            cuda.cuInit(0) == 0
            and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
            and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
        )
    except (OSError, AttributeError):
        return False


def wait(thread: threading.Thread | None, timeout_s: float = 120.0) -> None:
    """Before the process's own first CUDA call: the driver's start ended (it would wait on it anyway)."""
    if thread is not None:
        thread.join(timeout_s)
