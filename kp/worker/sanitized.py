"""The worker's command of the sanitize stage (--sanitize): the row's call on inputs it draws itself, at the shape its
reference has now (the judge scales the worker to the smallest shape it judged), with its backward pass under
--backward. Under compute-sanitizer the worker runs inside the tool, which watches every kernel the call launches,
and the judge reads the tool's report once the worker has ended; in the shared-memory pass every SM's shared memory is
first filled with one byte value (kp/kernels/shared_poison.cu) and the call's output goes back to the judge
(kp.judge.sanitize). A part of kp.worker.loop.Worker over the worker's one state."""

from __future__ import annotations

import torch

from kp.lib.build import build_path
from kp.lib.layers import set_precision
from kp.lib.registry import JUDGE_KERNELS
from kp.worker.backward_pass import backward_pass, upstream_like
from kp.worker.measuring import export_output

SHARED_POISON = JUDGE_KERNELS / "shared_poison.cu"


class SanitizeCommands:
    """Worker commands of the sanitize stage; see the module doc."""

    def __init__(self, state):
        self.state = state

    def cmd_sanitized_call(self, label: str, seed: int, backward: bool = False, fill: int | None = None):
        """One call of the row (and its backward pass from one upstream gradient drawn here, under --backward),
        every kernel of it finished before the reply: a hazard the tool finds is in its report by then. fill: a
        byte every SM's shared memory holds right before the call; the reply then carries the call's output."""
        st = self.state
        x = st.ref.inputs(seed, st.device)
        model = st.models[label]
        set_precision(st.precision)
        # the fill right before each pass (under --backward, the forward's and the backward's), where asked
        fill_now = build_path(SHARED_POISON, "judge").ops.poison_shared if fill is not None else None
        before = (lambda: fill_now(fill)) if fill_now is not None else None
        if backward:
            with torch.no_grad():
                ups = upstream_like(model(*x))
            if before is not None:
                before()
            out, xs = backward_pass(model, x, ups, between=before)
            grads = tuple(t.grad for t in xs if getattr(t, "grad", None) is not None)
            out = (*(out if isinstance(out, tuple) else (out,)), *grads)  # the output, then the inputs' gradients
        else:
            if before is not None:
                before()
            with torch.no_grad():
                out = model(*x)
        if st.device == "cuda":
            torch.cuda.synchronize()
        return {"out": export_output(out, x) if fill is not None else None}
