"""The worker's timing command: baselines and rows interleaved, each call on inputs drawn just before it, every
sample told to the judge as it is taken. A part of kp.worker.loop.Worker over the worker's one state
(kp.worker.state.WorkerState: the models, the baselines, the reference, the channel to the judge); the profiling
commands (the escape check's runs, the profile tables, the memory peak) are kp.worker.profiling's."""

from __future__ import annotations

import contextlib
import dataclasses
import os

import torch

from kp.judge.reference import describe
from kp.lib.layers import set_precision
from kp.lib.timing import bench_interleaved
from kp.worker.backward_pass import backward_pass, upstream_like
from kp.worker.guards import late_message, late_threads

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
        models = st.with_baselines(labels)
        pool = [st.ref.inputs(fresh_seed(), dev) for _ in range(pool_size)]
        ups = []
        if backward:
            set_precision(st.precision)
            with torch.no_grad():
                first = next(iter(models.values()))  # eager: every timing has it
                ups = [upstream_like(first(*x)) for x in pool]
        calls = TimedCalls(st, models, pool, ups, labels, every_call and not backward, backward)
        rungs = {k: m.rung(*pool[0]) for k, m in models.items() if hasattr(m, "rung")}
        set_precision(st.precision)
        with contextlib.nullcontext() if backward else torch.no_grad():
            times = bench_interleaved(
                {k: calls.call(k, m) for k, m in models.items()},
                min_reps=min_reps,
                max_reps=max_reps,
                budget_s=budget_s,
                warmup=WARMUP,
                before=calls.before,
                clock="cuda" if dev == "cuda" else "host",
                after=calls.after,
            )
            calls.hand_over()
        reply = {
            "timing": {k: dataclasses.asdict(t) for k, t in times.items()},
            "calls": dict(calls.tally["n"]),
            "rungs": rungs,
        }
        if dev == "cuda":
            torch.cuda.synchronize()
            reply["memory"] = {**mem, "peak_allocated": torch.cuda.max_memory_allocated()}
        return reply


class TimedCalls:
    """The interleaved timing's hooks (kp.lib.timing.bench_interleaved's before, call and after) over one pool of
    inputs: before each call its slot refilled from a fresh seed and the call before handed over; each call's output
    kept only while it is the last timed call of a row the judge may check. `tally` is the one state they share: the
    calls made of each model, the slot and seed of the call now timed, the output kept for the hand-over.
    labels_asked: the rows whose timed calls the judge may check (none when timing the backward: its gradients
    were judged at parity)."""

    def __init__(self, st, models: dict, pool: list, ups: list, labels: list[str], every_call: bool, backward: bool):
        self.st, self.models, self.pool, self.ups = st, models, pool, ups
        self.labels, self.every_call, self.backward = labels, every_call, backward
        self.labels_asked = [] if backward else labels
        self.tally = {"n": {k: 0 for k in models}, "slot": 0, "calls": 0, "kept": None, "timed": None}

    def no_late_threads(self) -> None:
        """A thread of the candidate's still working: the call escaped the timer. Said before any output of the
        call crosses: a CPU tensor crosses by moving its storage to shared memory, under a thread still writing the
        old one (which kills the process: a crash where the verdict is this reason)."""
        st = self.st
        late = late_threads(st.threads_before, st.candidate_dir) if st.candidate_dir else []
        if late:
            raise RuntimeError(late_message(late))

    def hand_over(self) -> None:
        """The last timed call, told to the judge before any other code of the models runs: its sample, and for a
        judged row its seed; the output crosses only if the judge asks for it."""
        self.no_late_threads()
        tally, st = self.tally, self.st
        if tally["kept"] is None:
            return
        label, rep, seed, out, slot, ms = tally["kept"]
        tally["kept"] = None
        if st.device == "cuda":
            # device-wide, as for parity: work a row left elsewhere is the escape check's to catch, with its own reason
            torch.cuda.synchronize()
        if st.interim({"label": label, "rep": rep, "seed": seed, "ms": ms, "ask": label in self.labels_asked}):
            st.interim(
                {
                    "label": label,
                    "rep": rep,
                    "seed": seed,
                    "out": export_output(out, self.pool[slot]),
                    "type": describe(out),
                    "inputs": self.pool[slot],
                }
            )
            del out
            if st.device == "cuda":  # the judge has let go of the output it checked: its memory comes back now,
                torch.cuda.ipc_collect()  # not when the allocator next runs short

    def before(self, name: str, rep: int) -> None:
        self.hand_over()
        tally, st = self.tally, self.st
        slot = tally["calls"] % len(self.pool)
        s = fresh_seed()
        fresh = st.ref.inputs(s, st.device)
        for dst, src in zip(self.pool[slot], fresh):
            if isinstance(dst, torch.Tensor):
                dst.copy_(src)
        del fresh, src  # a draw as large as the inputs: gone before the call, whatever holds this frame
        if self.backward:
            for u in self.ups[slot]:
                if u is not None:
                    u.normal_()
            model = self.models[name]
            for p in model.parameters() if isinstance(model, torch.nn.Module) else ():
                p.grad = None
        tally["n"][name] += 1
        tally["calls"] += 1
        tally["slot"] = slot
        tally["timed"] = (name, rep, s, slot) if rep >= 0 else None
        if self.every_call and rep < 0 and name in self.labels:
            st.interim({"label": name, "rep": rep, "seed": s, "advance": True})

    def call(self, name: str, m):
        tally, pool, ups = self.tally, self.pool, self.ups
        keep = name in self.labels_asked  # a baseline's output is not kept: only its sample is told

        def f():
            slot = tally["slot"]
            out = backward_pass(m, pool[slot], ups[slot])[0] if self.backward else m(*pool[slot])
            timed = tally["timed"]
            if timed is not None:
                tally["kept"] = [*timed[:3], out if keep else None, timed[3], None]
                tally["timed"] = None

        return f

    def after(self, name: str, rep: int, ms: float) -> None:
        kept = self.tally["kept"]
        if kept is not None and kept[0] == name and kept[1] == rep:
            kept[5] = ms
