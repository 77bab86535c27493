"""The worker's timing command: baselines and rows interleaved, each call on inputs drawn just before it, every
sample told to the judge as it is taken. A part of kp.worker.loop.Worker over the worker's one state
(kp.worker.state.WorkerState: the models, the baselines, the reference, the channel to the judge); the profiling
commands (the escape check's runs, the profile tables, the memory peak) are kp.worker.profiling's."""

from __future__ import annotations

import contextlib
import dataclasses
import os

import torch

from kp.worker.guards import late_message, late_threads
from kp.worker.backward_pass import backward_pass, upstream_like
from kp.judge.reference import describe
from kp.lib.layers import set_precision
from kp.lib.timing import bench_interleaved

WARMUP = 3  # untimed calls of each row before timing


def export_output(out, inputs=()):
    """What leaves the worker: plain tensors and Python numbers, element by element for a tuple; anything else
    as its description (the judge rejects it). An output that is, or is a view of, one of the judge's inputs (an
    in-place activation) leaves as a copy: a tensor received from another process cannot be sent back through it."""
    if type(out) is torch.Tensor:
        ptrs = {x.untyped_storage().data_ptr() for x in inputs if isinstance(x, torch.Tensor)}
        out = out.detach() if out.requires_grad else out  # values, not autograd's graph (which cannot cross)
        return out.clone() if out.numel() and out.untyped_storage().data_ptr() in ptrs else out
    if isinstance(out, (int, float, bool)):
        return out
    if isinstance(out, (tuple, list)):
        return tuple(export_output(o, inputs) for o in out)
    return describe(out)


def fresh_seed() -> int:
    """A timed call's input seed, drawn from the OS just before the call: nothing in the process knows it earlier."""
    return int.from_bytes(os.urandom(4), "little")


class TimingCommands:
    """The worker's timing command; see the module doc."""

    def __init__(self, state):
        self.state = state

    # -- timing -------------------------------------------------------------------------------------------------
    def cmd_time(
        self,
        labels: list[str],
        pool_size: int,
        min_reps: int,
        max_reps: int,
        budget_s: float,
        every_call: bool = False,
        backward: bool = False,
    ):
        """Baselines and rows interleaved; every call gets inputs drawn just before it from a seed drawn from the
        OS then (a pool slot refilled outside the timed region), so no input can be known before its call. After each
        timed call, outside the timed region and before any other code of the models runs, the judge is told its
        sample (`interim`), and for a judged row its seed, and answers whether it checks that call; only then does the
        output cross, so which calls are checked is decided in the judge's process after the fact. Returns every
        sample too; the judge keeps its own and takes the median itself. every_call (a reference whose calls carry
        state): the untimed calls of judged rows are told too, seed only, before each runs, so the judge can advance
        its reference through the same calls.
        backward (--backward, after the forward's timing): each call is a training step, the forward and its backward
        pass from an upstream gradient drawn with the inputs (kp.worker.backward_pass.backward_pass), each parameter's
        .grad cleared before it, outside the timed region (zero_grad(set_to_none=True)); samples only are told: the
        gradients were judged at parity, call by call."""
        st = self.state
        dev = st.device
        st.held_inputs = None  # parity's last inputs: the timing pool replaces them
        if dev == "cuda":
            torch.cuda.ipc_collect()
            torch.cuda.reset_peak_memory_stats()
            mem = {"start_allocated": torch.cuda.memory_allocated()}
        fns_models = st.with_baselines(labels)
        pool = [st.ref.inputs(fresh_seed(), dev) for _ in range(pool_size)]
        ups = []
        if backward:
            set_precision(st.precision)
            with torch.no_grad():
                first = next(iter(fns_models.values()))  # eager: every timing has it
                ups = [upstream_like(first(*x)) for x in pool]
            every_call, labels_asked = False, []
        else:
            labels_asked = labels
        tally = {"n": {k: 0 for k in fns_models}, "slot": 0, "calls": 0, "kept": None, "timed": None}
        rungs = {k: m.rung(*pool[0]) for k, m in fns_models.items() if hasattr(m, "rung")}

        def no_late_threads():
            """A thread of the candidate's still working: the call escaped the timer. Said before any output of the
            call crosses: a CPU tensor crosses by moving its storage to shared memory, under a thread still
            writing the old one (which kills the process: a crash where the verdict is this reason)."""
            late = late_threads(st.threads_before, st.candidate_dir) if st.candidate_dir else []
            if late:
                raise RuntimeError(late_message(late))

        def hand_over():
            """The last timed call, told to the judge before any other code of the models runs: its sample, and for
            a judged row its seed; the output crosses only if the judge asks for it."""
            no_late_threads()
            if tally["kept"] is not None:
                label, rep, seed, out, slot, ms = tally["kept"]
                tally["kept"] = None
                if dev == "cuda":
                    # device-wide, as for parity: work a row left elsewhere is the escape check's to catch, with its own
                    # reason
                    torch.cuda.synchronize()
                if st.interim({"label": label, "rep": rep, "seed": seed, "ms": ms, "ask": label in labels_asked}):
                    st.interim(
                        {
                            "label": label,
                            "rep": rep,
                            "seed": seed,
                            "out": export_output(out, pool[slot]),
                            "type": describe(out),
                            "inputs": pool[slot],
                        }
                    )
                    del out
                    if dev == "cuda":  # the judge has let go of the output it checked: its memory comes back now,
                        torch.cuda.ipc_collect()  # not when the allocator next runs short

        def before(name, rep):
            hand_over()
            slot = tally["calls"] % pool_size
            s = fresh_seed()
            fresh = st.ref.inputs(s, dev)
            for dst, src in zip(pool[slot], fresh):
                if isinstance(dst, torch.Tensor):
                    dst.copy_(src)
            del fresh, src  # a draw as large as the inputs: gone before the call, whatever holds this frame
            if backward:
                for u in ups[slot]:
                    if u is not None:
                        u.normal_()
                for p in fns_models[name].parameters() if isinstance(fns_models[name], torch.nn.Module) else ():
                    p.grad = None
            tally["n"][name] += 1
            tally["calls"] += 1
            tally["slot"] = slot
            tally["timed"] = (name, rep, s, slot) if rep >= 0 else None
            if every_call and rep < 0 and name in labels:
                st.interim({"label": name, "rep": rep, "seed": s, "advance": True})

        def call(name, m):
            def f():
                slot = tally["slot"]
                out = backward_pass(m, pool[slot], ups[slot])[0] if backward else m(*pool[slot])
                timed = tally["timed"]
                if timed is not None:  # a baseline's output is not kept: only its sample is told
                    tally["kept"] = [*timed[:3], out if name in labels_asked else None, timed[3], None]
                    tally["timed"] = None

            return f

        def after(name, rep, ms):
            if tally["kept"] is not None and tally["kept"][0] == name and tally["kept"][1] == rep:
                tally["kept"][5] = ms

        fns = {k: call(k, m) for k, m in fns_models.items()}
        set_precision(st.precision)
        with contextlib.nullcontext() if backward else torch.no_grad():
            times = bench_interleaved(
                fns,
                min_reps=min_reps,
                max_reps=max_reps,
                budget_s=budget_s,
                warmup=WARMUP,
                before=before,
                clock="cuda" if dev == "cuda" else "host",
                after=after,
            )
            hand_over()
        reply = {
            "timing": {k: dataclasses.asdict(t) for k, t in times.items()},
            "calls": dict(tally["n"]),
            "rungs": rungs,
        }
        if dev == "cuda":
            torch.cuda.synchronize()
            reply["memory"] = {**mem, "peak_allocated": torch.cuda.max_memory_allocated()}
        return reply
