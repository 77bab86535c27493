"""The worker's parity commands: one call on the judge's inputs (with its backward pass under --backward), the
inputs let go, the buffers a call changed. A part of kp.worker.loop.Worker over the worker's one state
(kp.worker.state.WorkerState: the models, the inputs it holds, the device and the precision)."""

from __future__ import annotations

import time

import torch

from kp.worker.backward_pass import call_with_backward
from kp.worker.measuring import export_output
from kp.judge.reference import describe
from kp.lib.layers import set_precision


def nan_fill_cached_free(reserve_bytes: int) -> int:
    """Fill the caching allocator's free blocks (and at least reserve_bytes of them) with 0xFF bytes = NaN, so
    memory a model allocates and never writes reads as NaN instead of stale, plausible values. The reserve is the
    judge's own headroom, not the model's request: where the GPU has no room for all of it, the most of it that
    fits in halves down to 1/16 is filled and the call goes on (what the model then asks for is its own). Returns
    the bytes of the reserve left unfilled (0 where it all fit)."""
    if not torch.cuda.is_available():
        return 0
    held = []
    short = 0
    if reserve_bytes > 0:
        size = reserve_bytes
        while size >= reserve_bytes // 16:
            try:
                held.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
                break
            except torch.OutOfMemoryError:
                size //= 2
        short = reserve_bytes - (held[0].numel() if held else 0)
    small = 1 << 20  # requests up to 1 MiB come from the small pool
    last_free = None
    for _ in range(512):
        free = [
            (b["size"], seg.get("segment_type", "large"))
            for seg in torch.cuda.memory_snapshot()
            for b in seg["blocks"]
            if b["state"] == "inactive"
        ]
        total = sum(s for s, _ in free)
        if not free or total == last_free:
            break
        last_free = total
        size, kind = max(free)
        held.append(torch.empty(min(size, small) if kind == "small" else size, dtype=torch.uint8, device="cuda"))
    for t in held:
        t.fill_(0xFF)
    del held
    return short


class CallCommands:
    """Worker commands of the parity stage; see the module doc."""

    def __init__(self, state):
        self.state = state

    def cmd_forward(self, label: str, inputs, reserve_bytes: int, grad: dict | None = None):
        """One parity call; with `grad` ({"upstream": [...], "zero": bool}, --backward) its backward pass too, and
        the gradients in the reply."""
        st = self.state
        # Held until the next two calls' inputs have arrived: a buffer the judge refills then maps to the same
        # address, and one it moved from stays mapped (kp.judge.calls: a graph replaying it reads it, not a fault)
        st.held_inputs = ((st.held_inputs or (None,))[-1], inputs)
        t0 = time.perf_counter()
        short = 0
        if st.device == "cuda":
            torch.cuda.ipc_collect()
            short = nan_fill_cached_free(reserve_bytes)
        t1 = time.perf_counter()
        set_precision(st.precision)
        grads = None
        if grad is not None:
            out, grads = call_with_backward(st.models[label], inputs, grad["upstream"], grad["zero"])
        else:
            with torch.no_grad():
                out = st.models[label](*inputs)
        if st.device == "cuda":
            torch.cuda.synchronize()  # device-wide: side-stream work finishes before the output leaves
        t2 = time.perf_counter()
        sent = export_output(out, inputs)
        return {
            "out": sent,
            "type": describe(out),
            "tf32_after": torch.backends.cuda.matmul.allow_tf32,
            "grads": grads,
            "nan_fill_short": short,
            "seconds": {
                "unwritten memory filled with NaN": t1 - t0,
                "the model's call": t2 - t1,
                "the output made ready to send": time.perf_counter() - t2,
            },
        }

    def cmd_release_inputs(self):
        self.state.held_inputs = None
        return {}

    def cmd_buffers(self, label: str):
        m = self.state.models[label]
        if not isinstance(m, torch.nn.Module):
            return {"buffers": {}}
        return {"buffers": {k: v.detach().clone() for k, v in m.state_dict().items()}}
