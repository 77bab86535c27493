"""One checked call of the parity stage (check_call, over the judge's run): the candidate's own copy of the inputs
(refilled at the addresses it has seen, or moved to new ones), the call, its inputs compared bit for bit afterwards,
its output judged against the float64 reference, its BatchNorm buffers against the reference's."""

from __future__ import annotations

import time

import torch

from kp.errors import Rejected
from kp.judge.compare import Budget, compare
from kp.judge.expected import Row, _Refs, _same_buffer, _unread_counter
from kp.judge.outputs import Expected, _out_bytes_hint, judge_output
from kp.judge.release import release_cached
from kp.judge.plan import memory_need
from kp.lib.numerics import clone_layout, rel_error, same_values


def _layout(x: torch.Tensor) -> tuple:
    return x.dtype, x.device, x.shape, x.stride(), x.storage_offset(), x.untyped_storage().nbytes()


def moved_call(index: int) -> bool:
    """Whether the parity sequence's call `index` (from 0) gets its inputs at new addresses: every other call from
    the third on. The second call, and every other one after it, refills the buffers of the call before, at the
    same addresses (a cache keyed on an input's address is caught there)."""
    return index >= 2 and index % 2 == 0


STALE_INPUTS = "its output follows an earlier call's inputs (a CUDA graph or a cache captured on their tensors)"


def candidate_inputs(run, pristine: list, moved: bool = False) -> list:
    """The candidate's copy of the inputs. Successive calls whose inputs have one layout get one buffer,
    refilled (and the worker keeps the previous call's inputs mapped, so they arrive at the same address): a
    model that keys a cache on data_ptr() meets new values at an address it has seen and is caught at its
    second call, not whenever the allocator happens to hand an address back. moved: the inputs go to buffers of
    their own at addresses the candidate has not seen, the old ones kept alive (and mapped in the worker) until
    the next call, so a model that replays a CUDA graph or reads a cache captured on an earlier call's tensors
    reads that call's values there, in memory that is still its, and is caught without a fault."""
    out = []
    if moved:
        run.retired_buffers = dict(run.input_buffers)
    for i, x in enumerate(pristine):
        if not isinstance(x, torch.Tensor):
            out.append(x)
            continue
        buf = run.input_buffers.get(i)
        if moved or buf is None or _layout(buf) != _layout(x):
            buf = run.input_buffers[i] = clone_layout(x)
        else:
            buf.copy_(x)
        out.append(buf)
    if not moved:
        run.retired_buffers = {}
    return out


def in_retired_buffers(run, pristine: list) -> list | None:
    """This call's inputs written into the buffers the call before a moved one used (their old addresses), or
    None where those buffers are gone or of another layout."""
    old = run.retired_buffers
    out = []
    for i, x in enumerate(pristine):
        if not isinstance(x, torch.Tensor):
            out.append(x)
            continue
        buf = old.get(i)
        if buf is None or _layout(buf) != _layout(x):
            return None
        buf.copy_(x)
        out.append(buf)
    return out


def room_to_move(run, pristine: list) -> bool:
    """Whether a second copy of the inputs fits beside the first (on the GPU: its free memory, with a quarter
    to spare); on the host always."""
    need = sum(x.untyped_storage().nbytes() for x in pristine if isinstance(x, torch.Tensor) and x.is_cuda)
    if not need:
        return True
    room = int(1.25 * need) + (1 << 28)
    release_cached(room)  # the judge's cached blocks handed back where they stand in the way
    return torch.cuda.mem_get_info()[0] > room


def drop_input_buffers(run) -> None:
    """End of a parity stage: the buffers and the workers' mappings of them go (the timing stage needs room)."""
    run.input_buffers.clear()
    run.retired_buffers = {}
    for runner in {id(r.runner): r.runner for r in run.live()}.values():  # a rejected row's may hang
        try:
            runner.call("release", "release_inputs")
        except Rejected:
            pass  # a dead worker holds nothing
    release_if_short(run)


def check_call(
    run,
    row: Row,
    label: str,
    pristine: list,
    exp: Expected,
    widen=None,
    moved: bool = False,
    buffers: list | None = None,
    grads=None,
) -> dict:
    """One checked call. widen: at a derived input, a function giving the budgets widened to how far honest
    fp32 roundings move the reference there, asked only where the output is over its budget. moved: the inputs
    at new addresses (_candidate_inputs); buffers: the inputs as given (the diagnosis of a moved call)."""
    with run.clock.timed("check: the candidate's copy of the inputs"):
        cand_inputs = buffers if buffers is not None else candidate_inputs(run, pristine, moved)
    hint = _out_bytes_hint(pristine)
    # the worker's NaN-filled headroom beside the judge's cache (its float64 forward's blocks)
    if row.runner.isolated and torch.cuda.is_initialized():
        release_cached(hint + (256 << 20))
    t0 = time.perf_counter()
    reply = row.runner.call(
        label, "forward", row.label, cand_inputs, hint, *([grads.request()] if grads is not None else [])
    )
    inside = reply.get("seconds") if isinstance(reply.get("seconds"), dict) else {}
    inside = {k: s for k, s in inside.items() if isinstance(s, (int, float))}  # the worker's own account
    for part, s in inside.items():
        run.clock.tally(f"check: worker: {part}", s)
    run.clock.tally(
        "check: the call's round trip, outside the worker's parts", time.perf_counter() - t0 - sum(inside.values())
    )
    if reply.get("nan_fill_short") and not any(n.startswith("unwritten memory") for n in run.notes):
        run.notes.append(
            f"unwritten memory NaN-filled only in part at {label}: "
            f"{reply['nan_fill_short'] / 2**30:.1f} GiB of the worker's headroom had no room on "
            f"the GPU"
        )
    if run.precision == "fp32" and reply["tf32_after"]:
        raise Rejected(f"{label}: the model switched TF32 on in fp32 mode", kind="tampering", check=label)
    with run.clock.timed("check: the inputs compared bit for bit"):
        for i, (a, b) in enumerate(zip(cand_inputs, pristine)):
            if isinstance(b, torch.Tensor) and not same_values(a, b):
                raise Rejected(f"{label}: input {i} was modified", kind="input_modified", check=label)
    with run.clock.timed("check: the output against the float64 reference"):
        res = judge_output(label, reply["out"], reply["type"], exp, widen)
    if grads is not None:  # --backward: the gradients, after the output they come from
        with run.clock.timed("check: the gradients against the float64 reference's"):
            res["grads"] = run.gradients.check(row, label, reply.get("grads"), grads)
    if res.get("widened"):
        run.notes.append(
            f"{row.label} at {label}: over its budget, within how far honest fp32 "
            f"roundings move the reference there (relL2 {res['rel_l2']:.2e}, budget "
            f"{res['budget']:.2e})"
        )
    with run.clock.timed("check: the output and the inputs' copies dropped"):  # the output mapped from the worker
        del reply, cand_inputs
    with run.clock.timed("check: the GPU's cached memory handed back"):
        release_if_short(run)
    return res


def release_if_short(run) -> None:
    """The judge's cached GPU memory handed back only where the GPU has less free than the job plans for
    (kp.judge.release.release_cached says why: beside other slots' work a hand-back cost more than the checks)."""
    if torch.cuda.is_initialized():
        release_cached(memory_need(run.fp, len(run.rows)))


def check_buffers(run, row: Row, label: str, refs: _Refs) -> None:
    """The state the reference's calls change (BatchNorm running statistics in training mode) must be kept and
    match. A buffer the calls leave as built is the reference's constant, not state: a candidate may fold it
    away. BatchNorm's num_batches_tracked is read only when its momentum is None (a cumulative average)."""
    b32 = {k: v for k, v in refs.r32.named_buffers() if k not in refs.initial or not _same_buffer(v, refs.initial[k])}
    if not b32:
        return
    cand = row.runner.call(label, "buffers", row.label)["buffers"]
    b64 = dict(refs.r64.named_buffers())
    for k, v in b32.items():
        ck = (row.names or {}).get(k, k)
        if ck not in cand:
            if _unread_counter(refs.r32, k):
                continue
            mode = "training" if refs.r32.training else "eval"
            raise Rejected(
                f"{label}: the model has no buffer {k!r}, which the reference carries between its "
                f"{mode}-mode calls as state, so the candidate's state cannot be checked",
                kind="wrong_state",
                check=label,
            )
        c = cand[ck]
        if not v.is_floating_point():
            if not torch.equal(c.cpu(), v.cpu()):
                raise Rejected(
                    f"{label}: buffer {k} is {c.tolist()}, the reference's {v.tolist()}",
                    kind="wrong_state",
                    check=label,
                )
            continue
        if c.shape != v.shape:
            raise Rejected(
                f"{label}: buffer {k} has shape {tuple(c.shape)}, the reference's {tuple(v.shape)}",
                kind="wrong_state",
                check=label,
            )
        got = compare(c.to(v.device), b64[k], Budget.of(rel_error(v, b64[k]), refs.k, v.dtype))
        if not got.ok:
            raise Rejected(
                f"{label}: buffer {k} differs from the reference's (relL2 {got.err.rel_l2:.2e}, budget "
                f"{got.budget.limit.rel_l2:.2e})",
                figures=got.figures(f"{label}: buffer {k}"),
                kind="wrong_state",
                check=label,
            )
