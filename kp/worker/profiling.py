"""The worker's profiling commands: the escape check's paired host-clock and event runs with a profile (and which
kernels of the row's own ran, from its libraries or its JIT languages), the profile tables and the memory peak. A
part of kp.worker.loop.Worker over the worker's one state (kp.worker.state.WorkerState); the timing command is
kp.worker.measuring's."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

from kp.judge.window import run_queue_ms
from kp.lib.build import cache_root, shared_cache
from kp.lib.layers import set_precision
from kp.lib.timing import L2Flusher
from kp.observe.profile import cpu_ops, gpu_events, kernel_base_name, profiler, summarize
from kp.worker.backward_pass import backward_pass, upstream_like
from kp.worker.guards import loaded_objects, system_prefixes
from kp.worker.languages import jit_kernels, match


class ProfileCommands:
    """Worker commands that profile; see the module doc."""

    def __init__(self, state):
        self.state = state

    def cmd_escape(self, label: str, seed: int, backward: bool = False):
        """backward (--backward): the call checked is the forward and its backward pass, from one upstream
        gradient drawn here."""
        st = self.state
        x = st.ref.inputs(seed, st.device)
        model = st.models[label]
        f = profiled = lambda: model(*x)
        if backward:  # profiled: a marker kernel between the passes, so the forward's own GPU work is known apart
            with torch.no_grad():
                ups = upstream_like(model(*x))
            f = lambda: backward_pass(model, x, ups)
            profiled = lambda: backward_pass(model, x, ups, between=lambda: torch.cuda._sleep(1000))
        flush = L2Flusher()
        set_precision(st.precision)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        samples, control = [], []
        nothing = lambda: None
        with torch.no_grad():
            f()
            torch.cuda.synchronize()
            for _ in range(5):
                # the control: the same steps around no call, so a loaded host or a shared GPU shows there too
                for g, out in ((nothing, control), (f, samples)):
                    flush()
                    torch.cuda.synchronize()
                    h0 = time.perf_counter()
                    start.record()
                    e0 = time.perf_counter()
                    g()
                    e1 = time.perf_counter()
                    q0 = run_queue_ms()  # the wait for a CPU while it waits for the GPU: not the call's
                    stop.record()
                    torch.cuda.synchronize()
                    q1 = run_queue_ms()
                    h1 = time.perf_counter()
                    out.append(((h1 - h0) * 1e3, start.elapsed_time(stop), (e1 - e0) * 1e3, q1 - q0))
            marker = None  # the marker kernel's name, from a profile of the marker alone
            with profiler() as p0:
                torch.cuda._sleep(1000)
                torch.cuda.synchronize()
            evs = gpu_events(p0)
            if evs:
                marker = evs[0]["name"]
            flush()
            torch.cuda.synchronize()
            with profiler() as prof:
                torch.cuda._sleep(20000)
                profiled()
                torch.cuda._sleep(20000)
                torch.cuda.synchronize()
                time.sleep(0.05)  # work a thread defers by up to 50 ms still lands in the trace
                torch.cuda.synchronize()
        events = gpu_events(prof)
        caches = tuple(str(c) for c in (cache_root(), shared_cache()) if c)
        libs = sorted(
            p
            for p in loaded_objects()
            if p.startswith(caches)
            or (p not in st.objects_before and not any(p.startswith(pre) for pre in system_prefixes()))
        )
        own, blobs = {}, {}
        for p in libs:
            try:
                blobs[p] = Path(p).read_bytes()
            except OSError:
                pass
        jit = {"own": {}, "foreign": {}}
        if st.candidate_dir:
            try:
                jit = jit_kernels(
                    st.candidate_dir,
                    [vars(m) for n, m in sys.modules.items() if n == "kp_candidate"] + list(st.models.values()),
                )
            except Exception as e:  # the judge's own look failed: said in the record, no kernel counted by it
                jit["error"] = f"{type(e).__name__}: {e}"[:200]
        for e in events:
            if e["kind"] != "kernel" or e["name"] == marker:
                continue
            lang = jit["own"].get(match(e["name"], jit["own"]) or "")
            if lang:  # a kernel compiled at run time from the candidate's code (Triton, CuPy, Numba)
                own.setdefault(e["name"], lang)
                continue
            base = kernel_base_name(e["name"]).encode()
            hit = next((p for p, b in blobs.items() if base and base in b), None)
            if hit:
                own.setdefault(e["name"], f"CUDA C++, {os.path.basename(hit)}")
        return {
            "samples": samples,
            "control": control,
            "events": events,
            "marker": marker,
            "own": own,
            "foreign": jit["foreign"],
            "jit_error": jit.get("error"),
        }

    def cmd_profile(self, labels: list[str], seed: int):
        """One call of each baseline and row under PyTorch's profiler, after a warm call (and on the GPU an L2
        flush): its kernels (on the CPU: operators) grouped by name."""
        st = self.state
        x = st.ref.inputs(seed, st.device)
        gpu = st.device == "cuda"
        flush = L2Flusher() if gpu else None
        set_precision(st.precision)
        out = {}
        with torch.no_grad():
            for label, model in st.with_baselines(labels).items():
                model(*x)
                if gpu:
                    flush()
                    torch.cuda.synchronize()
                with profiler(gpu) as prof:
                    model(*x)
                    if gpu:
                        torch.cuda.synchronize()
                out[label] = summarize(gpu_events(prof) if gpu else cpu_ops(prof))
        return {"profile": out}

    def cmd_memory(self):
        cuda = torch.cuda.is_available()
        return {
            "peak": torch.cuda.max_memory_reserved() if cuda else 0,
            "held": torch.cuda.memory_reserved() if cuda else 0,
        }
