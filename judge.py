"""The judge: one set of stages for the playground's own variants and for anybody's ModelNew, against any
KernelBench-format reference (a file with ``Model``, ``get_inputs()``, ``get_init_inputs()``; the built-in problems
under models/ are such files with optional extras: declared ``CASES``, ``traffic``, ``BOUND``, ``PRECISIONS``).

This process owns the inputs, the fp32 and float64 references, every comparison and the verdict. The models being
judged live in a *runner*: for a candidate file, a spawned worker process that imports it (so it cannot patch the
comparisons; the worker fingerprints the torch/time namespaces and reports any change); for the playground's own
variants, the same Worker class called in this process. Either way the same commands run in the same order.

Stages (a failure rejects that row with a one-line reason, ``rejected: <stage>: <reason>``):
 1. construct: ``ModelNew(*get_init_inputs())`` after the reference's seed; the reference's state_dict is loaded
    into it (by name, or in order where names differ but shapes line up).
 2. parity, one stateful sequence of calls on benchmark-shape inputs: ``trials`` calls on fresh inputs, with the
    weights changed between them the ways training does (an optimizer step on random gradients, a
    ``load_state_dict`` of new values, an in-place edit), then derived inputs (negated, x100, shifted) where the
    float64 reference stays finite; then every declared case on a fresh model. Per call: the allocator's cached
    free memory is NaN-filled, the candidate runs on its own copy, its inputs are compared bit for bit afterwards,
    every output element is compared with the float64 reference (relL2 overall and worst row within
    max(4 x PyTorch's own error in the chosen precision, 1e-6); NaN/Inf positions must match), then buffers
    (BatchNorm running statistics) are compared with the reference's.
 3. escape: one call inside a profiler window bounded by marker kernels; any GPU work outside it, or a host clock
    that sees more than the events, rejects.
 4. own kernel: the profiled call must run a kernel from a shared object the row loaded (its load_inline build or
    the playground's kernel cache), unless ``allow_torch`` (the row is then labelled pure PyTorch).
 5. timing: eager, torch.compile and every row interleaved (harness.bench_interleaved), every call on freshly
    generated inputs, after one more weight change; two timed calls per row (the first, and one drawn at random)
    are checked against the reference outside the timed region, after a device-wide synchronize.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib
import importlib.util
import json
import os
import random
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path

import torch

import harness
from harness import UsageError, budget_from, clone_layout, rel_error, same_values

PRECISIONS = harness.PRECISIONS
MIN_TRIALS = 3
REPLY_TIMEOUT_S = 900  # one worker step (a cold kernel build plus a torch.compile fit well inside)
# The changes made to the weights between parity calls, in this order (cycled when there are more trials).
UPDATES = ("optimizer step", "load_state_dict", "in-place edit")
UPDATE_SIZE = 0.01  # each change moves a parameter by ~1% of its mean magnitude: far above any rounding budget
# Inputs derived from the benchmark inputs (floating tensors only): a kernel that is right only for torch.rand's
# [0, 1) fails one of them (e.g. a softmax without the max subtraction overflows at x100).
DERIVED = {"negated": lambda x: -x, "scaled x100": lambda x: x * 100, "shifted -3": lambda x: x - 3}
FLOAT64_ON_DEVICE_MAX = 512 << 20  # problems up to this footprint get their float64 reference on the GPU; larger
#                                     ones on the host (a full float64 copy would not fit ~3x the footprint)
MEMORY_FACTOR = 3  # the judge's peak GPU memory target: this many times the problem's inputs + outputs + weights
WARMUP = 3  # untimed calls of each row before timing (the judge derives the inputs of checked timed calls from it)
CPU_BENCH_MAX = 256 << 20  # on --device cpu, benchmark-shape calls run only when inputs + outputs are this small


class Rejected(Exception):
    """The row failed a check; str() is the one-line reason."""


# ---------------------------------------------------------------------------------------------------------------
# The reference.

class Reference:
    """A KernelBench-format reference: a built-in problem module or any file with Model, get_inputs and
    get_init_inputs. Optional extras: CASES, traffic, BOUND, PRECISIONS, ModelNew/variants (built-in problems)."""

    def __init__(self, module, name: str, spec: tuple[str, str]):
        missing = [k for k in ("Model", "get_inputs", "get_init_inputs") if not hasattr(module, k)]
        if missing:
            raise UsageError(f"{spec[1]} is not a KernelBench-format reference: it defines no {', '.join(missing)}")
        self.module, self.name, self.spec = module, name, spec
        self.cases = dict(getattr(module, "CASES", {}))
        self.precisions = tuple(getattr(module, "PRECISIONS", ("fp32",)))
        self.bound = getattr(module, "BOUND", None)
        self.problem = spec[1] if spec[0] == "problem" else None

    @classmethod
    def load(cls, spec: tuple[str, str]) -> "Reference":
        kind, what = spec
        if kind == "problem":
            return cls(harness.problem_module(what), what, spec)
        path = Path(what).resolve()
        if not path.is_file():
            raise UsageError(f"reference file {what!r} does not exist")
        name = f"kp_ref_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}"
        sp = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(sp)
        sys.modules[name] = module
        try:
            sp.loader.exec_module(module)
        except Exception as e:
            raise UsageError(f"reference file {what}: import failed: {type(e).__name__}: {_first_line(e)}") from None
        return cls(module, path.stem, ("file", str(path)))

    def init(self) -> list:
        return list(self.module.get_init_inputs())

    def inputs(self, seed: int, device) -> list:
        """get_inputs() under the seed, drawn straight on the device (KernelBench files draw from the global
        generator; on a GPU this is far faster than drawing 6 GB on the host)."""
        torch.manual_seed(seed)
        with torch.device(device):
            xs = self.module.get_inputs()
        return [x.to(device) if isinstance(x, torch.Tensor) else x for x in xs]

    def case(self, name: str, seed: int, device) -> tuple[list, list]:
        g = torch.Generator().manual_seed(seed)
        return self.cases[name](g, device)

    def model(self, init, seed: int, device) -> torch.nn.Module:
        torch.manual_seed(seed)
        return self.module.Model(*init).to(device)

    def footprint(self, device: str) -> dict:
        """Bytes of the benchmark inputs, outputs and weights, and the reference's FLOPs (torch's FlopCounterMode),
        from a run on the meta device (nothing allocated); from one real call on `device` when the model cannot
        run on meta (an op without a meta kernel, a data-dependent shape)."""
        from torch.utils.flop_counter import FlopCounterMode
        try:
            return self._footprint("meta", FlopCounterMode)
        except Exception:
            return self._footprint(device, FlopCounterMode)

    def _footprint(self, device: str, counter_cls) -> dict:
        with torch.device(device):
            torch.manual_seed(0)
            xs = self.module.get_inputs()
            m = self.module.Model(*self.init())
            counter = counter_cls(display=False)
            with counter, torch.no_grad():
                out = m(*xs)
        nbytes = lambda ts: sum(t.numel() * t.element_size() for t in ts if isinstance(t, torch.Tensor))
        return {"shapes": ", ".join("x".join(map(str, t.shape)) for t in xs if isinstance(t, torch.Tensor)),
                "inputs": nbytes(xs), "outputs": nbytes(_as_list(out)),
                "weights": nbytes(list(m.parameters()) + list(m.buffers())),
                "flops": int(counter.get_total_flops())}

    def traffic(self, inputs, init, fp: dict, opts: dict | None = None) -> dict:
        """Fewest bytes and FLOPs of one call: the file's own `traffic` when it has one, else the unique bytes of
        inputs, outputs and weights and the FLOPs counted on the reference."""
        if hasattr(self.module, "traffic"):
            return self.module.traffic(*inputs, init=init, **(opts or {}))
        return {"bytes": fp["inputs"] + fp["outputs"] + fp["weights"], "flops": fp["flops"]}


def _as_list(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


# ---------------------------------------------------------------------------------------------------------------
# Pure helpers (no GPU, unit-tested in CI).

def trial_seeds(seed: int, n: int) -> list[int]:
    """Call i draws its inputs from seed + i: `--seed S` replays every call of a run that printed S."""
    return [(seed + i) % 2**32 for i in range(n)]


def timed_call_seed(seed0: int, n: int) -> int:
    """Inputs of a row's n-th call in the timing stage (warm-up, preceding and timed calls all count)."""
    return (seed0 + n) % 2**32


def describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"{type(x).__name__} {tuple(x.shape)} {x.dtype} {x.device}"
    if isinstance(x, (tuple, list)):
        return f"{type(x).__name__} of {len(x)}"
    return type(x).__name__


def kernel_base_name(name: str) -> str:
    """'void kp::softmax_kernel<8>(float const*, ...)' -> 'softmax_kernel' (what a symbol table contains)."""
    s = name.strip().replace("(anonymous namespace)", "anon")
    for prefix in ("void ", "__global__ "):
        if s.startswith(prefix):
            s = s[len(prefix):]
    depth, cut = 0, len(s)
    for i, ch in enumerate(s):  # first '(' or '<' outside template brackets ends the qualified name
        if ch in "(<" and depth == 0:
            cut = i
            break
    s = s[:cut]
    return s.split("::")[-1].strip()


def window_violations(events: list[dict], marker: str) -> tuple[list[dict], tuple[float, float] | None]:
    """GPU activities outside the window between the first and the last `marker` kernel (trace microseconds).
    Returns (violations, window); window None when the markers are missing (that itself is a failure)."""
    marks = [e for e in events if e["name"] == marker]
    if len(marks) < 2:
        return [], None
    lo = marks[0]["ts"] + marks[0]["dur"]
    hi = marks[-1]["ts"]
    inside = [e for e in events if e is not marks[0] and e is not marks[-1]]
    bad = [e for e in inside if e["ts"] < lo - 1.0 or e["ts"] + e["dur"] > hi + 1.0]  # 1 us: trace rounding
    return bad, (lo, hi)


def host_clock_excess_ms(samples: list[tuple[float, float, float]]) -> float:
    """samples: (wall ms from before the start event to after a device-wide synchronize, event ms, enqueue ms).
    Work on the timed stream finishes within max(enqueue, event) plus a synchronize's latency; the median excess
    beyond that is time the events did not see."""
    ex = sorted(w - max(ev, enq) for w, ev, enq in samples)
    return ex[len(ex) // 2] if ex else 0.0


def escape_threshold_ms(event_ms: float) -> float:
    """Excess over which the host clock says work escaped: 0.2 ms (synchronize + Python latency seen on an H200 is
    tens of us) plus 20% of the call."""
    return 0.2 + 0.2 * event_ms


def budget_reason(label: str, err, budget) -> str:
    if err.nonfinite_mismatch:
        return (f"{label}: {err.nonfinite_mismatch} NaN/Inf positions differ from the reference "
                f"(elements never written read as NaN)")
    return (f"{label}: relL2 {err.rel_l2:.2e} (worst row {err.worst_row:.2e}) over budget {budget.rel_l2:.2e} "
            f"({budget.worst_row:.2e})")


def memory_need(fp: dict, models: int) -> int:
    """GPU bytes the judge plans for: MEMORY_FACTOR x the problem's inputs, outputs and weights (the model's copy of
    the inputs, its output, PyTorch's output, the timing pool, the references' weights), plus one copy of the
    weights for each judged model beyond the first (every row is alive while rows are timed side by side)."""
    return MEMORY_FACTOR * (fp["inputs"] + fp["outputs"] + fp["weights"]) + max(models - 1, 0) * fp["weights"]


def check_memory(name: str, fp: dict, models: int, free: int) -> None:
    """One line before any work when the judge would not fit."""
    need = memory_need(fp, models)
    fbytes = fp["inputs"] + fp["outputs"] + fp["weights"]
    if need > free:
        raise UsageError(f"{name} needs about {need / 2**30:.1f} GiB of GPU memory ({MEMORY_FACTOR} x "
                         f"{fbytes / 2**30:.1f} GiB of inputs, outputs and weights"
                         + (f", and the weights of {models} models" if models > 1 and fp["weights"] else "")
                         + f"); {free / 2**30:.1f} GiB are free")


def set_precision(precision: str) -> None:
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def state_map(ref_keys: list[tuple[str, tuple]], cand_keys: list[tuple[str, tuple]]) -> dict[str, str] | None:
    """Reference state_dict key -> candidate key: by name when the names agree, else in order when the shapes line
    up one for one (a renamed attribute); None when neither holds."""
    if {k: s for k, s in ref_keys} == {k: s for k, s in cand_keys}:
        return {k: k for k, _ in ref_keys}
    if len(ref_keys) == len(cand_keys) and all(a[1] == b[1] for a, b in zip(ref_keys, cand_keys)):
        return {a[0]: b[0] for a, b in zip(ref_keys, cand_keys)}
    return None


def make_update(kind: str, model: torch.nn.Module, seed: int) -> dict:
    """A change of the floating-point parameters, the way training makes one, as data both sides apply alike."""
    g = torch.Generator().manual_seed(seed)
    params = [(k, p) for k, p in model.named_parameters() if p.is_floating_point() and p.numel()]
    if not params:
        return {}

    def noise(p):
        scale = float(p.detach().abs().mean()) or 1.0
        return (torch.randn(p.shape, generator=g, dtype=torch.float32) * scale).to(p.device, p.dtype)

    if kind == "optimizer step":  # SGD, lr UPDATE_SIZE, on random gradients of each parameter's scale
        return {"kind": kind, "lr": UPDATE_SIZE, "grads": {k: noise(p) for k, p in params}}
    if kind == "load_state_dict":  # new values for every parameter, loaded with load_state_dict(strict=False)
        return {"kind": kind, "state": {k: p.detach() + UPDATE_SIZE * noise(p) for k, p in params}}
    k, p = max(params, key=lambda kp: kp[1].numel())  # in place, under no_grad, on the largest parameter
    return {"kind": kind, "name": k, "delta": UPDATE_SIZE * noise(p)}


def rename_update(update: dict, names: dict[str, str]) -> dict:
    out = dict(update)
    if "grads" in update:
        out["grads"] = {names[k]: v for k, v in update["grads"].items()}
    if "state" in update:
        out["state"] = {names[k]: v for k, v in update["state"].items()}
    if "name" in update:
        out["name"] = names[update["name"]]
    return out


def apply_update(model: torch.nn.Module, update: dict) -> None:
    """What the reference and every judged model do with an update (the same code on both sides)."""
    if not update:
        return
    if update["kind"] == "optimizer step":
        ps = [model.get_parameter(k) for k in update["grads"]]
        for p, grad in zip(ps, update["grads"].values()):
            p.grad = grad.clone()
        torch.optim.SGD(ps, lr=update["lr"]).step()
        for p in ps:
            p.grad = None
    elif update["kind"] == "load_state_dict":
        model.load_state_dict(update["state"], strict=False)
    else:
        with torch.no_grad():
            model.get_parameter(update["name"]).add_(update["delta"])


# ---------------------------------------------------------------------------------------------------------------
# Worker: holds the judged models; runs in a spawned process for a candidate file, in this process for variants.

def _namespaces():
    import time as time_mod
    import torch.nn.functional as F
    return {"torch": torch, "torch.nn.functional": F, "torch.Tensor": torch.Tensor,
            "torch._C.TensorBase": torch._C.TensorBase, "torch.nn.Module": torch.nn.Module,
            "torch.cuda": torch.cuda, "torch.cuda.Event": torch.cuda.Event, "torch.cuda.Stream": torch.cuda.Stream,
            "torch.profiler": torch.profiler, "torch.special": torch.special, "torch.linalg": torch.linalg,
            "torch.optim.SGD": torch.optim.SGD, "time": time_mod, "harness": harness}


def namespace_fingerprint() -> dict[str, object]:
    """Every callable the judge, the timer and the baselines can reach by attribute lookup, by identity."""
    snap = {}
    for ns_name, ns in _namespaces().items():
        for k, v in list(vars(ns).items()):
            if callable(v) and not isinstance(v, types.ModuleType):
                snap[f"{ns_name}.{k}"] = v
    return snap


def fingerprint_changes(before: dict[str, object]) -> list[str]:
    now = namespace_fingerprint()
    return sorted(k for k, v in before.items() if now.get(k) is not v)


def nan_fill_cached_free(reserve_bytes: int) -> None:
    """Fill the caching allocator's free blocks (and at least reserve_bytes of them) with 0xFF bytes = NaN, so
    memory a model allocates and never writes reads as NaN instead of stale, plausible values."""
    if not torch.cuda.is_available():
        return
    held = []
    if reserve_bytes > 0:
        held.append(torch.empty(reserve_bytes, dtype=torch.uint8, device="cuda"))
    small = 1 << 20  # requests up to 1 MiB come from the small pool
    last_free = None
    for _ in range(512):
        free = [(b["size"], seg.get("segment_type", "large")) for seg in torch.cuda.memory_snapshot()
                for b in seg["blocks"] if b["state"] == "inactive"]
        total = sum(s for s, _ in free)
        if not free or total == last_free:
            break
        last_free = total
        size, kind = max(free)
        held.append(torch.empty(min(size, small) if kind == "small" else size, dtype=torch.uint8, device="cuda"))
    for t in held:
        t.fill_(0xFF)
    del held


def _loaded_objects() -> set[str]:
    try:
        with open("/proc/self/maps") as f:
            return {ln.split(None, 5)[5].strip() for ln in f if ln.count(" ") >= 5 and ".so" in ln}
    except OSError:
        return set()


def _system_prefixes() -> list[str]:
    import site
    from torch.utils.cpp_extension import CUDA_HOME
    pre = [os.path.dirname(torch.__file__), sys.prefix, sys.base_prefix, "/usr/lib", "/lib", "/usr/local/lib",
           "/usr/local/nvidia", "/usr/local/cuda"]
    pre += site.getsitepackages() + [site.getusersitepackages()]
    if CUDA_HOME:
        pre.append(CUDA_HOME)
    return [p for p in pre if p]


def export_output(out):
    """What leaves the worker: plain tensors and Python numbers, element by element for a tuple; anything else
    as its description (the judge rejects it)."""
    if type(out) is torch.Tensor or isinstance(out, (int, float, bool)):
        return out
    if isinstance(out, (tuple, list)):
        return tuple(export_output(o) for o in out)
    return describe(out)


class Worker:
    """Models under judgement ("rows", by label), the eager/torch.compile baselines, and the commands the judge
    sends. `interim` is how a timed call's output reaches the judge for checking (a pipe round trip from a spawned
    worker, a plain call in-process)."""

    def __init__(self, ref_spec, device: str, precision: str, factories: dict | None = None, conn=None):
        self.ref = Reference.load(ref_spec)
        self.device, self.precision, self.conn = device, precision, conn
        self.factories = dict(factories or {})
        self.models: dict[str, object] = {}
        self.baselines = {}
        self.fingerprint = None
        self.objects_before = _loaded_objects()
        self.interim = self._interim_pipe

    def loop(self):
        while True:
            try:
                msg = self.conn.recv()
            except EOFError:
                return
            cmd, args = msg[0], msg[1:]
            if cmd == "quit":
                self.conn.send({"ok": True})
                return
            try:
                reply = getattr(self, "cmd_" + cmd)(*args)
                reply["ok"] = True
            except Exception as e:  # the candidate's failure is data for the judge, not a crash of the worker
                reply = {"ok": False, "error": f"{type(e).__name__}: {_first_line(e)}",
                         "traceback": traceback.format_exc(limit=8)}
            if self.fingerprint is not None:
                reply["patched"] = fingerprint_changes(self.fingerprint)
            self.conn.send(reply)
            if not reply["ok"] and self.device == "cuda" and _cuda_broken():
                return  # a sticky CUDA error: this context is gone; the judge sees the pipe close

    def _interim_pipe(self, msg: dict) -> None:
        self.conn.send({"interim": True, **msg})
        self.conn.recv()

    # -- setup --------------------------------------------------------------------------------------------------
    def cmd_baselines(self, init, seed, state, compile_baseline: bool, example_seed: int):
        """Eager and torch.compile references for the timing table, built and run once before any judged model
        exists (the fingerprint is taken after their first calls, so their own lazy setup is not a change)."""
        eager = self.ref.model(init, seed, self.device)
        eager.load_state_dict(state)
        self.baselines = {"eager": eager}
        if compile_baseline:  # shares eager's weights: one copy of them on the device
            self.baselines["torch.compile"] = torch.compile(eager)
        x = self.ref.inputs(example_seed, self.device)
        set_precision(self.precision)
        with torch.no_grad():
            for m in self.baselines.values():
                m(*x)
        torch.cuda.synchronize()
        return {}

    def cmd_load(self, path: str):
        # Everything the judge's own stages import or initialise happens before the snapshot: importing
        # torch._dynamo (the profiler does) rebinds torch.manual_seed, which is torch's doing, not the candidate's.
        import torch._dynamo  # noqa: F401
        from torch.profiler import ProfilerActivity, profile
        torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)  # torch wraps SGD.step on first use
        if self.device == "cuda":
            harness.L2Flusher()
            e = torch.cuda.Event(enable_timing=True)
            with profile(activities=[ProfilerActivity.CUDA]):
                e.record()
                torch.cuda._sleep(10)
                torch.cuda.synchronize()
        self.fingerprint = namespace_fingerprint()
        self.objects_before = _loaded_objects()
        p = Path(path).resolve()
        sys.path.insert(0, str(p.parent))
        spec = importlib.util.spec_from_file_location("kp_candidate", p)
        module = importlib.util.module_from_spec(spec)
        sys.modules["kp_candidate"] = module
        spec.loader.exec_module(module)
        if not isinstance(getattr(module, "ModelNew", None), type):
            return {"has_model_new": False}
        self.factories["candidate"] = module.ModelNew
        return {"has_model_new": True}

    def cmd_build(self, label: str, init, seed: int):
        self.models.pop(label, None)
        torch.manual_seed(seed)
        m = self.factories[label](*init)
        m = m.to(self.device) if isinstance(m, torch.nn.Module) else m
        self.models[label] = m
        keys = ([(k, tuple(v.shape)) for k, v in m.state_dict().items()] if isinstance(m, torch.nn.Module) else [])
        return {"keys": keys}

    def cmd_update(self, label: str, update: dict):
        apply_update(self.models[label], update)
        return {}

    def cmd_drop(self, label: str):
        self.models.pop(label, None)
        return {}

    # -- parity -------------------------------------------------------------------------------------------------
    def cmd_forward(self, label: str, inputs, reserve_bytes: int):
        if self.device == "cuda":
            torch.cuda.ipc_collect()
            nan_fill_cached_free(reserve_bytes)
        set_precision(self.precision)
        with torch.no_grad():
            out = self.models[label](*inputs)
        if self.device == "cuda":
            torch.cuda.synchronize()  # device-wide: side-stream work finishes before the output leaves
        return {"out": export_output(out), "type": describe(out),
                "tf32_after": torch.backends.cuda.matmul.allow_tf32}

    def cmd_buffers(self, label: str):
        m = self.models[label]
        if not isinstance(m, torch.nn.Module):
            return {"buffers": {}}
        return {"buffers": {k: v.detach().clone() for k, v in m.state_dict().items()}}

    # -- timing -------------------------------------------------------------------------------------------------
    def cmd_time(self, labels: list[str], seed0: int, pool_size: int, min_reps: int, max_reps: int,
                 budget_s: float, check_reps: list[int]):
        """Baselines and rows interleaved; every call gets freshly generated inputs (a pool refilled from a new
        seed before each call, outside the timed region); the timed calls of `check_reps` are handed to the judge
        through `interim` before the next call (outside the timed region) and dropped."""
        dev = self.device
        fns_models = {**self.baselines, **{k: self.models[k] for k in labels}}
        pool = [self.ref.inputs(seed0, dev) for _ in range(pool_size)]
        st = {"n": {k: 0 for k in fns_models}, "slot": 0, "calls": 0, "kept": None, "check": None}
        rungs = {k: m.rung(*pool[0]) for k, m in fns_models.items() if hasattr(m, "rung")}

        def hand_over():
            if st["kept"] is not None:
                label, rep, seed, out, slot = st["kept"]
                st["kept"] = None
                torch.cuda.synchronize()  # device-wide, as for parity: work a row left elsewhere is the escape
                #                           check's to catch, with its own reason
                self.interim({"label": label, "rep": rep, "seed": seed, "out": export_output(out),
                              "type": describe(out), "inputs": pool[slot]})

        def before(name, rep):
            hand_over()
            slot = st["calls"] % pool_size
            s = timed_call_seed(seed0, st["n"][name])
            for dst, src in zip(pool[slot], self.ref.inputs(s, dev)):
                if isinstance(dst, torch.Tensor):
                    dst.copy_(src)
            st["n"][name] += 1
            st["calls"] += 1
            st["slot"] = slot
            st["check"] = (name, rep, s, slot) if name in labels and rep in check_reps else None

        def call(name, m):
            def f():
                out = m(*pool[st["slot"]])
                if st["check"] is not None:
                    st["kept"] = (*st["check"][:3], out, st["check"][3])
                    st["check"] = None
            return f

        fns = {k: call(k, m) for k, m in fns_models.items()}
        set_precision(self.precision)
        with torch.no_grad():
            times = harness.bench_interleaved(fns, min_reps=min_reps, max_reps=max_reps, budget_s=budget_s,
                                              warmup=WARMUP, before=before)
            hand_over()
        torch.cuda.synchronize()
        return {"timing": {k: dataclasses.asdict(t) for k, t in times.items()}, "calls": dict(st["n"]),
                "rungs": rungs}

    # -- escape + own kernel --------------------------------------------------------------------------------------
    def cmd_escape(self, label: str, seed: int):
        from torch.profiler import ProfilerActivity, profile
        x = self.ref.inputs(seed, self.device)
        model = self.models[label]
        f = lambda: model(*x)
        flush = harness.L2Flusher()
        set_precision(self.precision)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        samples = []
        with torch.no_grad():
            f()
            torch.cuda.synchronize()
            for _ in range(5):
                flush()
                torch.cuda.synchronize()
                h0 = time.perf_counter()
                start.record()
                e0 = time.perf_counter()
                f()
                e1 = time.perf_counter()
                stop.record()
                torch.cuda.synchronize()
                h1 = time.perf_counter()
                samples.append(((h1 - h0) * 1e3, start.elapsed_time(stop), (e1 - e0) * 1e3))
            marker = None  # the marker kernel's name, from a profile of the marker alone
            with profile(activities=[ProfilerActivity.CUDA]) as p0:
                torch.cuda._sleep(1000)
                torch.cuda.synchronize()
            evs = _gpu_events(p0)
            if evs:
                marker = evs[0]["name"]
            flush()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                torch.cuda._sleep(20000)
                f()
                torch.cuda._sleep(20000)
                torch.cuda.synchronize()
                time.sleep(0.05)  # work a thread defers by up to 50 ms still lands in the trace
                torch.cuda.synchronize()
        events = _gpu_events(prof)
        cache = str(harness.cache_root())
        libs = sorted(p for p in _loaded_objects()
                      if p.startswith(cache) or (p not in self.objects_before
                                                 and not any(p.startswith(pre) for pre in _system_prefixes())))
        own, blobs = {}, {}
        for p in libs:
            try:
                blobs[p] = Path(p).read_bytes()
            except OSError:
                pass
        for e in events:
            if e["kind"] != "kernel" or e["name"] == marker:
                continue
            base = kernel_base_name(e["name"]).encode()
            hit = next((p for p, b in blobs.items() if base and base in b), None)
            if hit:
                own.setdefault(e["name"], os.path.basename(hit))
        return {"samples": samples, "events": events, "marker": marker, "own": own}

    def cmd_memory(self):
        return {"peak": torch.cuda.max_memory_reserved() if torch.cuda.is_available() else 0}


def _gpu_events(prof) -> list[dict]:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    kinds = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
    out = []
    for e in trace.get("traceEvents", []):
        k = kinds.get(str(e.get("cat", "")).lower())
        if k and e.get("ph") == "X":
            args = e.get("args", {})
            out.append({"name": e.get("name", ""), "kind": k, "ts": float(e["ts"]), "dur": float(e.get("dur", 0)),
                        "stream": args.get("stream")})
    out.sort(key=lambda e: e["ts"])
    return out


def _first_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return s[0][:300] if s else ""


def _cuda_broken() -> bool:
    try:
        torch.cuda.synchronize()
        return False
    except Exception:
        return True


def worker_main(conn, ref_spec, device: str, precision: str, root: str):
    import warnings
    warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
    sys.path.insert(0, root)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    Worker(ref_spec, device, precision, conn=conn).loop()


# ---------------------------------------------------------------------------------------------------------------
# Runners: the same commands, in a spawned process or in this one.

class ProcessRunner:
    """A spawned worker and the request/reply protocol; a dead worker or a timeout becomes a rejection."""
    isolated = True

    def __init__(self, ref_spec, device: str, precision: str, on_interim):
        import torch.multiprocessing as tmp
        ctx = tmp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=worker_main, args=(child, ref_spec, device, precision, str(harness.ROOT)),
                                daemon=True)
        self.proc.start()
        child.close()
        self.on_interim = on_interim

    def call(self, stage: str, *msg, timeout: float = REPLY_TIMEOUT_S) -> dict:
        try:
            self.conn.send(msg)
            while True:
                deadline = time.monotonic() + timeout
                while not self.conn.poll(1.0):
                    if not self.proc.is_alive():
                        raise Rejected(f"{stage}: the candidate's process died (exit code {self.proc.exitcode})")
                    if time.monotonic() > deadline:
                        raise Rejected(f"{stage}: no answer within {timeout:.0f} s")
                reply = self.conn.recv()
                if not reply.get("interim"):
                    break
                self.on_interim(reply)
                self.conn.send(("ack",))
        except (EOFError, BrokenPipeError, ConnectionResetError):
            self.proc.join(5)
            raise Rejected(f"{stage}: the candidate's process died (exit code {self.proc.exitcode})") from None
        if reply.get("patched"):
            raise Rejected(f"{stage}: the candidate replaced {', '.join(reply['patched'][:4])} in its process "
                           f"(judge, timer and baselines depend on them)")
        if not reply.get("ok"):
            raise Rejected(f"{stage}: raised {reply.get('error')}")
        return reply

    def close(self):
        try:
            if self.proc.is_alive():
                self.conn.send(("quit",))
                self.proc.join(10)
        except (OSError, EOFError, BrokenPipeError):
            pass
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


class LocalRunner:
    """The Worker in this process: for the playground's own variants (trusted code, same stages)."""
    isolated = False

    def __init__(self, ref_spec, device: str, precision: str, on_interim, factories: dict):
        self.worker = Worker(ref_spec, device, precision, factories=factories)
        self.worker.interim = on_interim

    def call(self, stage: str, cmd: str, *args, **_) -> dict:
        try:
            return getattr(self.worker, "cmd_" + cmd)(*args)
        except Rejected:
            raise
        except Exception as e:
            raise Rejected(f"{stage}: raised {type(e).__name__}: {_first_line(e)}") from None

    def close(self):
        self.worker.models.clear()
        self.worker.baselines.clear()


# ---------------------------------------------------------------------------------------------------------------
# The judge.

@dataclasses.dataclass
class Row:
    label: str
    runner: object
    peer: bool = False  # somebody else's code (e.g. a Triton GEMM): measured and shown, a failure is not ours
    opts: dict = dataclasses.field(default_factory=dict)
    accepted: bool = True
    reason: str = ""
    checks: dict = dataclasses.field(default_factory=dict)
    names: dict | None = None  # reference state_dict key -> this row's key
    pure_torch: bool = False
    path: str | None = None  # the candidate file
    own_kernels: dict | None = None
    kernels: list | None = None
    escape: dict | None = None

    def reject(self, reason: str) -> None:
        if self.accepted:
            self.accepted, self.reason = False, reason


class _Refs:
    """The fp32 and float64 reference models, carrying state (BatchNorm running statistics) across calls like the
    judged models, with the same weight changes applied."""

    def __init__(self, ref: Reference, init, seed: int, device: str, f64_device: str):
        self.r32 = ref.model(init, seed, device)
        self.r64 = copy.deepcopy(self.r32).double().to(f64_device)
        self.f64_device = f64_device

    def state(self) -> dict:
        return self.r32.state_dict()

    def keys(self) -> list[tuple[str, tuple]]:
        return [(k, tuple(v.shape)) for k, v in self.r32.state_dict().items()]

    def update(self, update: dict) -> None:
        apply_update(self.r32, update)
        with torch.no_grad():
            for (_, p32), (_, p64) in zip(self.r32.named_parameters(), self.r64.named_parameters()):
                p64.copy_(p32)

    def expected(self, pristine: list, precision: str) -> Expected:
        set_precision(precision)
        with torch.no_grad():
            r32 = self.r32(*[clone_layout(x) for x in pristine])
            r64 = self.r64(*[x.to(self.f64_device, torch.float64) if isinstance(x, torch.Tensor)
                             and x.is_floating_point() else
                             (x.to(self.f64_device) if isinstance(x, torch.Tensor) else x) for x in pristine])
        set_precision("fp32")
        if self.f64_device == "cpu" and torch.cuda.is_available():  # pinned: each chunk of the comparison crosses
            r64 = tuple(t.pin_memory() if isinstance(t, torch.Tensor) else t for t in _as_list(r64)) \
                if isinstance(r64, (tuple, list)) else r64.pin_memory()  # PCIe at full speed
        return Expected.of(r32, r64)


@dataclasses.dataclass
class Expected:
    """What a call must return: per output element the float64 reference and the budget from PyTorch's own fp32
    error on the same inputs (or, for a non-tensor element, the value itself)."""
    is_tuple: bool
    specs: list  # per element: (shape, dtype, device) of PyTorch's fp32 output, or the non-tensor value
    r64: list
    errs: list  # per element: (PyTorch's own Err, budget Err), None for a non-tensor element

    @classmethod
    def of(cls, r32, r64) -> "Expected":
        r32l, r64l = _as_list(r32), _as_list(r64)
        specs, errs = [], []
        for a, b in zip(r32l, r64l):
            if isinstance(a, torch.Tensor):
                e = rel_error(a, b)
                specs.append((tuple(a.shape), a.dtype, a.device))
                errs.append((e, budget_from(e)))
            else:
                specs.append(a)
                errs.append(None)
        return cls(isinstance(r32, (tuple, list)), specs, r64l, errs)

    def finite(self) -> bool:
        return all(bool(torch.isfinite(t).all()) for t in self.r64 if isinstance(t, torch.Tensor)
                   and t.is_floating_point())


def judge_output(label: str, out, out_type: str, exp: Expected) -> dict:
    """Every element of the output against the float64 reference, within its budget; raises Rejected."""
    n = len(exp.specs)
    if exp.is_tuple != isinstance(out, tuple) or (exp.is_tuple and len(out) != n):
        want = f"a tuple of {n}" if exp.is_tuple else "one torch.Tensor"
        raise Rejected(f"{label}: output is {out_type}, expected {want}")
    outs = list(out) if exp.is_tuple else [out]
    worst = {"rel_l2": 0.0, "worst_row": 0.0, "torch_rel_l2": 0.0, "budget": 0.0}
    for i, (o, spec, b, errs) in enumerate(zip(outs, exp.specs, exp.r64, exp.errs)):
        where = label if not exp.is_tuple else f"{label}: output[{i}]"
        if errs is None:
            if o != spec:
                raise Rejected(f"{where}: {o!r}, the reference gives {spec!r}")
            continue
        shape, dtype, device = spec
        if type(o) is not torch.Tensor or tuple(o.shape) != shape or o.dtype != dtype or o.device != device:
            raise Rejected(f"{where}: output is {o if isinstance(o, str) else describe(o)}, expected "
                           f"torch.Tensor {shape} {dtype} {device}")
        e = rel_error(o, b)
        e_ref, budget = errs
        if not e.within(budget):
            raise Rejected(budget_reason(where, e, budget))
        worst = {"rel_l2": max(worst["rel_l2"], e.rel_l2), "worst_row": max(worst["worst_row"], e.worst_row),
                 "torch_rel_l2": max(worst["torch_rel_l2"], e_ref.rel_l2),
                 "budget": max(worst["budget"], budget.rel_l2)}
    return worst


def _out_bytes_hint(pristine: list) -> int:
    """NaN-filled headroom the worker keeps in its allocator: twice the largest input plus 64 MiB (a larger
    request just gets fresh memory, which the allocator does not zero either)."""
    sizes = [x.numel() * x.element_size() for x in pristine if isinstance(x, torch.Tensor)]
    return 2 * max(sizes, default=0) + (64 << 20)


def _release():
    """Hand cached GPU memory back: a spawned worker shares the device and needs room for its own."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def row_specs(ref: Reference, variant_list: list[str]) -> list[tuple[str, str, dict, bool]]:
    """(label, variant, ModelNew options, peer) of every row of a built-in problem: each variant as is, plus each
    variant under each of the problem's ROW_OPTIONS (e.g. matmul_sum_max_mean_lse's cache=False)."""
    out = [(v, v, {}, False) for v in variant_list]
    for tag, opts in getattr(ref.module, "ROW_OPTIONS", {}).items():
        opts = dict(opts)
        only = opts.pop("variants", None)  # an option that applies to some rungs only (e.g. a cuBLAS mode)
        peer = bool(opts.pop("peer", False))
        out += [(f"{v}[{tag}]", v, dict(opts), peer) for v in variant_list if only is None or v in only]
    return out


def default_variants(problem: str) -> list[str]:
    """Every variant file, plus the dispatching default (e.g. `auto`) when it is not a file of its own."""
    d = getattr(harness.problem_module(problem), "DEFAULT_VARIANT", None)
    vs = harness.variants(problem)
    return vs + ([d] if d and d not in vs else [])


class Judge:
    def __init__(self, ref: Reference, *, seed: int | None = None, trials: int = MIN_TRIALS,
                 precision: str = "fp32", device: str | None = None, bench: bool = True,
                 compile_baseline: bool = True, allow_torch: bool = False, min_reps: int = 10, max_reps: int = 100,
                 budget_s: float = 20.0, log=harness._progress):
        if precision not in PRECISIONS:
            raise UsageError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        if trials < MIN_TRIALS:
            raise UsageError(f"at least {MIN_TRIALS} trials, got {trials}")
        if device is None:
            if not torch.cuda.is_available():
                raise UsageError("no CUDA device visible: use a GPU machine (or --device cpu for the host-side "
                                 "parity checks of a pure-torch candidate)")
            device = "cuda"
        if device not in ("cuda", "cpu"):
            raise UsageError(f"device must be cuda or cpu, got {device!r}")
        if device == "cuda" and not torch.cuda.is_available():
            raise UsageError("no CUDA device visible")
        self.ref, self.precision, self.device, self.trials = ref, precision, device, trials
        self.bench, self.compile_baseline, self.allow_torch = bench, compile_baseline, allow_torch
        self.reps = (min_reps, max_reps, budget_s) if bench else (3, 3, 5.0)
        self.seed = int.from_bytes(os.urandom(4), "little") if seed is None else seed
        self.log = log
        self.rows: list[Row] = []
        self.runners: list = []
        self.timed_refs: dict[int, tuple] = {}
        self.fp = ref.footprint(device)
        fbytes = self.fp["inputs"] + self.fp["outputs"] + self.fp["weights"]
        self.f64_device = device if fbytes <= FLOAT64_ON_DEVICE_MAX else "cpu"
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()

    # -- rows ---------------------------------------------------------------------------------------------------
    def add_candidate(self, path: str | Path) -> Row:
        path = Path(path)
        if not path.is_file():
            raise UsageError(f"candidate file {str(path)!r} does not exist")
        runner = ProcessRunner(self.ref.spec, self.device, self.precision, self._interim)
        self.runners.append(runner)
        row = Row("candidate", runner, path=str(path))
        self.rows.append(row)
        return row

    def add_variants(self, rows: list[tuple[str, str, dict, bool]]) -> list[Row]:
        if not rows:
            return []
        mod = self.ref.module
        factories = {}
        for label, v, opts, _ in rows:
            o = {**opts, **({"precision": self.precision} if self.precision != "fp32" else {})}
            factories[label] = lambda *init, v=v, o=o: mod.ModelNew(*init, variant=v, **o)
        runner = LocalRunner(self.ref.spec, self.device, self.precision, self._interim, factories)
        self.runners.append(runner)
        out = [Row(label, runner, peer=peer, opts=opts) for label, _, opts, peer in rows]
        self.rows += out
        return out

    def live(self) -> list[Row]:
        return [r for r in self.rows if r.accepted]

    def _each(self, stage_fn):
        """Run stage_fn(row) for every live row; a Rejected rejects that row only."""
        for row in self.live():
            if not row.accepted:  # rejected by an earlier row's stage (a timed-call check)
                continue
            try:
                stage_fn(row)
            except Rejected as e:
                row.reject(str(e))
                self.log(f"{self.ref.name}: {row.label} rejected: {e}")

    # -- stages -------------------------------------------------------------------------------------------------
    def _build(self, row: Row, refs: _Refs, init, seed: int, stage: str = "construct", state=None) -> None:
        """Construct the row's model after the seed and load the reference's state (its state now, or `state`)."""
        keys = row.runner.call(stage, "build", row.label, init, seed)["keys"]
        ref_keys = refs.keys()
        names = state_map(ref_keys, [(k, tuple(s)) for k, s in keys]) if ref_keys else {}
        if names is None:
            ref_names = {k for k, _ in ref_keys}
            cand = {k for k, _ in keys}
            raise Rejected(f"{stage}: the state_dict does not match the reference's (missing "
                           f"{sorted(ref_names - cand)[:3]}, unexpected {sorted(cand - ref_names)[:3]}): weights can "
                           f"be neither loaded nor changed alike")
        row.names = names
        if names:
            state = {names[k]: v for k, v in (refs.state() if state is None else state).items()}
            row.runner.call(stage, "update", row.label, {"kind": "load_state_dict", "state": state})

    def _check_call(self, row: Row, label: str, pristine: list, exp: Expected) -> dict:
        cand_inputs = [clone_layout(x) for x in pristine]
        reply = row.runner.call(label, "forward", row.label, cand_inputs, _out_bytes_hint(pristine))
        if self.precision == "fp32" and reply["tf32_after"]:
            raise Rejected(f"{label}: the model switched TF32 on in fp32 mode")
        for i, (a, b) in enumerate(zip(cand_inputs, pristine)):
            if isinstance(b, torch.Tensor) and not same_values(a, b):
                raise Rejected(f"{label}: input {i} was modified")
        res = judge_output(label, reply["out"], reply["type"], exp)
        del reply, cand_inputs
        _release()
        return res

    def _check_buffers(self, row: Row, label: str, refs: _Refs) -> None:
        b32 = dict(refs.r32.named_buffers())
        if not b32:
            return
        cand = row.runner.call(label, "buffers", row.label)["buffers"]
        b64 = dict(refs.r64.named_buffers())
        for k, v in b32.items():
            ck = (row.names or {}).get(k, k)
            if ck not in cand:
                raise Rejected(f"{label}: the model has no buffer {k!r} (the reference's training-mode state "
                               f"cannot be checked)")
            c = cand[ck]
            if not v.is_floating_point():
                if not torch.equal(c.cpu(), v.cpu()):
                    raise Rejected(f"{label}: buffer {k} is {c.tolist()}, the reference's {v.tolist()}")
                continue
            if c.shape != v.shape:
                raise Rejected(f"{label}: buffer {k} has shape {tuple(c.shape)}, the reference's {tuple(v.shape)}")
            e_ref, e = rel_error(v, b64[k]), rel_error(c.to(v.device), b64[k])
            budget = budget_from(e_ref)
            if not e.within(budget):
                raise Rejected(f"{label}: buffer {k} differs from the reference's (relL2 {e.rel_l2:.2e}, budget "
                               f"{budget.rel_l2:.2e})")

    def _sequence(self) -> list[tuple[str, int, str | None, str | None]]:
        """(label, input seed, weight change before the call, derived-input transform) of the stateful parity
        calls on benchmark-shape inputs."""
        seeds = trial_seeds(self.seed, self.trials + len(DERIVED))
        calls = []
        for i in range(self.trials):
            upd = UPDATES[(i - 1) % len(UPDATES)] if i else None
            calls.append((f"trial {i + 1} (seed {seeds[i]}{', after an ' + upd if upd else ''})", seeds[i], upd,
                          None))
        for j, name in enumerate(DERIVED):
            s = seeds[self.trials + j]
            calls.append((f"inputs {name} (seed {s})", s, None, name))
        return calls

    def _parity_bench(self, init) -> None:
        refs = self.refs = _Refs(self.ref, init, self.seed, self.device, self.f64_device)
        self._each(lambda row: self._build(row, refs, init, self.seed))
        base_finite = None
        passed_before = {}
        for label, s, upd, derive in self._sequence():
            if not self.live():
                return
            if upd:
                self._each_update(refs, upd, s)
            pristine = self.ref.inputs(s, self.device)
            if derive and not any(isinstance(x, torch.Tensor) and x.is_floating_point() for x in pristine):
                self.skipped.append(f"{label}: no floating-point input to derive from")
                continue
            if derive:
                pristine = [DERIVED[derive](x) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                            for x in pristine]
            exp = refs.expected(pristine, self.precision)
            finite = exp.finite()
            if base_finite is None:
                base_finite = finite
            if derive and base_finite and not finite:
                self.skipped.append(f"{label}: the float64 reference is not finite there")
                self.log(f"{self.ref.name}: skipped {self.skipped[-1]}")
                continue

            def one(row):
                try:
                    row.checks[label] = self._check_call(row, label, pristine, exp)
                except Rejected as e:
                    if upd and passed_before.get(row.label):
                        raise Rejected(f"{e}; it passed before the weights changed ({upd}): a value derived from "
                                       f"the weights is not recomputed (stale weight cache)") from None
                    raise
                passed_before[row.label] = True
                self._check_buffers(row, f"buffers after {label}", refs)

            self._each(one)
            del pristine, exp
            _release()

    def _each_update(self, refs: _Refs, kind: str, seed: int) -> None:
        upd = make_update(kind, refs.r32, seed)
        refs.update(upd)
        self._each(lambda row: row.runner.call(f"weights ({kind})", "update", row.label,
                                               rename_update(upd, row.names)))

    def _parity_cases(self) -> None:
        seeds = [self.seed] if self.device == "cuda" else trial_seeds(self.seed, MIN_TRIALS)
        for name in self.ref.cases:
            for s in seeds:
                if not self.live():
                    return
                c_init, c_inputs = self.ref.case(name, s, self.device)
                c_refs = _Refs(self.ref, c_init, s, self.device, self.device)
                label = f"case {name} (seed {s})"
                state0 = {k: v.clone() for k, v in c_refs.state().items()}  # before the reference's call
                exp = c_refs.expected(c_inputs, self.precision)

                def one(row):
                    self._build(row, c_refs, c_init, s, stage=label, state=state0)
                    row.checks[label] = self._check_call(row, label, c_inputs, exp)
                    self._check_buffers(row, f"buffers after {label}", c_refs)
                    row.runner.call(label, "drop", row.label)

                self._each(one)
                del c_refs, c_inputs, exp

    def _interim(self, msg: dict) -> None:
        """A timed call's output, handed over by a worker outside the timed region: checked here."""
        row = next((r for r in self.rows if r.label == msg["label"] and r.accepted), None)
        if row is None:
            return
        seed = msg["seed"]
        pristine, exp = self.timed_refs[seed]
        label = f"timed call (rep {msg['rep']}, inputs seed {seed})"
        try:
            for i, (a, b) in enumerate(zip(msg["inputs"], pristine)):
                if isinstance(b, torch.Tensor) and not same_values(a, b):
                    raise Rejected(f"{label}: input {i} was modified")
            row.checks[label] = judge_output(label, msg["out"], msg["type"], exp)
        except Rejected as e:
            row.reject(str(e))
        del msg
        _release()

    def _rebuild(self, init) -> None:
        """The declared cases built models of their own shapes: back to the benchmark's, with the current weights."""
        self._each(lambda row: self._build(row, self.refs, init, self.seed, stage="escape"))

    def _timing(self) -> dict:
        refs = self.refs
        seed0 = (self.seed + 1000) % 2**32
        min_reps = self.reps[0]
        # no rows (a reference timed alone): nothing to check, so no references to compute
        check_reps = sorted({0, random.SystemRandom().randrange(1, max(2, min_reps))}) if self.live() else []
        self._each_update(refs, "in-place edit", (self.seed + 999) % 2**32)
        for rep in check_reps:
            s = timed_call_seed(seed0, WARMUP + 2 * rep + 1)  # warm-up calls, then (preceding, timed) pairs
            pristine = self.ref.inputs(s, self.device)
            exp = refs.expected(pristine, self.precision)
            # large problems keep the pristine inputs on the host, with their float64 reference
            self.timed_refs[s] = ([x.to(self.f64_device) if isinstance(x, torch.Tensor) else x for x in pristine],
                                  exp)
            del pristine, exp
        _release()
        result = {}
        timed = [(runner, [r for r in self.live() if r.runner is runner]) for runner in self.runners]
        timed = [(runner, rows) for runner, rows in timed if rows or not self.rows]  # no rows: baselines alone
        for runner, rows in timed:
            try:
                t = runner.call("timing", "time", [r.label for r in rows], seed0, 2, *self.reps, check_reps)
            except Rejected as e:
                for r in rows:
                    r.reject(str(e))
                continue
            result.setdefault("timing", {}).update(t["timing"])
            result.setdefault("rungs", {}).update(t["rungs"])
            result.setdefault("calls", {}).update(t["calls"])
        self.timed_refs.clear()
        return result

    def _escape(self, row: Row) -> dict:
        e = row.runner.call("escape", "escape", row.label, (self.seed + 2000) % 2**32)
        ev_ms = sorted(s[1] for s in e["samples"])[len(e["samples"]) // 2]
        excess = host_clock_excess_ms(e["samples"])
        bad, window = window_violations(e["events"], e["marker"])
        info = {"host_excess_ms": excess, "threshold_ms": escape_threshold_ms(ev_ms), "event_ms": ev_ms,
                "streams": sorted({str(x["stream"]) for x in e["events"] if x["name"] != e["marker"]}),
                "outside_window": [(x["name"][:80], x["stream"]) for x in bad]}
        row.escape = info
        if window is None:
            raise Rejected("escape: the profiler saw no marker kernels (is the profiler working here?)")
        if bad:
            x = bad[0]
            where = "after" if x["ts"] + x["dur"] > window[1] else "before"
            raise Rejected(f"escape: GPU work outside the timed window ({len(bad)} activities, e.g. "
                           f"{kernel_base_name(x['name'])[:60]} on stream {x['stream']} ending {where} the window): "
                           f"work escaped the timed stream")
        if excess > escape_threshold_ms(ev_ms):
            raise Rejected(f"escape: the host clock saw {excess:.3f} ms more than the CUDA events per call "
                           f"(events {ev_ms:.3f} ms): work escaped the timed stream")
        row.own_kernels = e["own"]
        row.kernels = sorted({x["name"][:120] for x in e["events"] if x["name"] != e["marker"]})
        if not e["own"]:
            if self.allow_torch or row.peer:
                row.pure_torch = not row.peer
            else:
                raise Rejected(f"own kernel: no kernel from the row's own build ran (kernels seen: "
                               f"{', '.join(kernel_base_name(k) for k in row.kernels[:4]) or 'none'}); "
                               f"--allow-torch judges a pure-PyTorch rewrite")
        return info

    def ceilings(self, traffic: dict) -> dict:
        """The ceilings measured now: device copy bandwidth for bytes, and the GEMM rates of the chosen precision
        for FLOPs when the reference does any; the bound from arithmetic intensity unless the file declares it."""
        bw = harness.copy_bandwidth()
        out = {"bandwidth": bw, "flops_rate": None, "rates": {}}
        if traffic.get("flops"):
            out["rates"] = harness.gemm_rates(precision=self.precision)
            out["flops_rate"] = max(out["rates"].values())
        bound = self.ref.bound
        if bound is None:
            t_bytes = traffic["bytes"] / bw
            t_flops = traffic["flops"] / out["flops_rate"] if out["flops_rate"] else 0.0
            bound = "compute" if t_flops > t_bytes else "memory"
        out["bound"] = bound
        return out

    # -- the whole run ------------------------------------------------------------------------------------------
    def run_cases(self) -> list[Row]:
        """The declared cases alone (small shapes, e.g. under compute-sanitizer); returns the rows."""
        self.skipped = []
        try:
            self._parity_cases()
        finally:
            for runner in self.runners:
                runner.close()
        return self.rows

    def run(self) -> dict:
        gpu = self.device == "cuda"
        seeds = [s for _, s, _, _ in self._sequence()]
        self.log(f"{self.ref.name}: seed {self.seed} (calls {', '.join(map(str, seeds))}; replay with --seed "
                 f"{self.seed})")
        self.skipped = []
        rec = {"reference": self.ref.name, "ref_spec": list(self.ref.spec), "seed": self.seed,
               "trial_seeds": seeds[:self.trials], "precision": self.precision, "device":
               torch.cuda.get_device_name() if gpu else "cpu", "torch": torch.__version__, "footprint": self.fp,
               "shape": self.fp["shapes"],
               "rows": {}, "skipped": self.skipped}
        init = self.ref.init()
        try:
            if gpu:
                check_memory(self.ref.name, self.fp, len(self.rows), torch.cuda.mem_get_info()[0])
            refs0 = self.ref.model(init, self.seed, self.device)
            state = refs0.state_dict()
            if gpu and self.bench:
                self.log(f"{self.ref.name}: building the eager{' and torch.compile' if self.compile_baseline else ''}"
                         f" baselines")
                for runner in self.runners:
                    runner.call("baselines", "baselines", init, self.seed, state, self.compile_baseline,
                                self.seed)
            del refs0, state
            for row in self.rows:
                if row.runner.isolated:
                    try:
                        if not row.runner.call("import", "load", str(Path(row.path).resolve()))["has_model_new"]:
                            row.reject("import: the file defines no class ModelNew")
                    except Rejected as e:
                        row.reject(str(e))
            t0 = time.perf_counter()
            bench_parity = gpu or self.fp["inputs"] + self.fp["outputs"] <= CPU_BENCH_MAX
            if bench_parity:
                self._parity_bench(init)
            else:
                rec["notes"] = (f"the benchmark shape ({(self.fp['inputs'] + self.fp['outputs']) / 2**20:,.0f} MiB)"
                                f" was not run on the CPU; declared cases only")
            self._parity_cases()
            self.log(f"{self.ref.name}: parity done in {time.perf_counter() - t0:.0f} s "
                     f"({sum(r.accepted for r in self.rows)}/{len(self.rows)} rows pass)")
            if gpu:
                t0 = time.perf_counter()
                self._rebuild(init)
                self._each(self._escape)  # first: work that escapes the timer would also race the timing loop
                timed = self._timing()
                self.log(f"{self.ref.name}: escape checks and timing done in {time.perf_counter() - t0:.0f} s")
                rec.update(timed)
                x = self.ref.inputs(self.seed, self.device)
                rec["traffic"] = {r.label: self.ref.traffic(x, init, self.fp, r.opts) for r in self.rows}
                rec["traffic"]["eager"] = rec["traffic"]["torch.compile"] = self.ref.traffic(x, init, self.fp)
                del x
                _release()
                peaks = [torch.cuda.max_memory_reserved()]  # before the ceilings' own probe buffers
                for runner in self.runners:
                    if runner.isolated:
                        try:
                            peaks.append(runner.call("memory", "memory")["peak"])
                        except Rejected:
                            pass
                rec["peak_gpu_bytes"] = sum(peaks)
                rec["memory_need"] = memory_need(self.fp, len(self.rows))
                if self.bench and rec.get("timing"):
                    rec.update(self.ceilings(rec["traffic"]["eager"]))
        finally:
            for runner in self.runners:
                runner.close()
        for row in self.rows:
            rec["rows"][row.label] = {
                "accepted": row.accepted, "reason": row.reason, "peer": row.peer, "checks": row.checks,
                "pure_torch": row.pure_torch, "own_kernels": row.own_kernels,
                "kernels": row.kernels, "escape": row.escape, "path": row.path, "opts": row.opts}
        rec["ok"] = all(r.accepted or r.peer for r in self.rows)
        rec["stages_not_run"] = ([] if gpu else ["timing", "escape", "own kernel"])
        return rec


def evaluate(ref: Reference | str, candidate: str | Path | None = None, variants: list[str] | None = None,
             **kw) -> dict:
    """Judge a candidate file and/or the playground's variants against a reference (a Reference, or a built-in
    problem id). Returns the record; rec['rows'][label]['accepted'] and ['reason'] carry the verdicts."""
    if isinstance(ref, str):
        ref = Reference.load(("problem", ref))
    j = Judge(ref, **kw)
    if variants:
        if ref.problem is None:
            raise UsageError("variants belong to built-in problems; --ref files are judged with --candidate")
        j.add_variants(row_specs(ref, variants))
    if candidate is not None:
        j.add_candidate(candidate)
    if not j.rows:  # the reference alone: eager vs torch.compile vs the ceilings
        j.runners.append(LocalRunner(ref.spec, j.device, j.precision, j._interim, {}))
    return j.run()


def verdict(rec: dict, label: str = "candidate") -> str:
    r = rec["rows"][label]
    if not r["accepted"]:
        return f"rejected: {r['reason']}"
    notes = []
    if rec.get("stages_not_run"):
        notes.append(f"parity only on {rec['device']}: {', '.join(rec['stages_not_run'])} checks need a GPU and "
                     f"were not run")
    if r.get("pure_torch"):
        notes.append("pure PyTorch: no kernel of its own ran (--allow-torch)")
    return "accepted" + (f" ({'; '.join(notes)})" if notes else "")


# ---------------------------------------------------------------------------------------------------------------
# The report: one table for the playground's variants and for candidates.

def format_record(rec: dict) -> str:
    gpu_peak = rec.get("peak_gpu_bytes")
    head = (f"{rec['reference']} [{rec.get('shape', '')}] seed {rec['seed']} on {rec['device']}, torch {rec['torch']}"
            + (f", precision {rec['precision']} (budget from PyTorch in that mode)"
               if rec["precision"] != "fp32" else ""))
    lines = [head]
    if gpu_peak is not None:
        fp = rec["footprint"]
        lines.append(f"peak GPU memory {gpu_peak / 2**30:.1f} GiB (inputs + outputs {(fp['inputs'] + fp['outputs']) / 2**30:.2f}"
                     f" GiB, weights {fp['weights'] / 2**30:.2f} GiB, {len(rec['rows'])} judged model(s); planned "
                     f"{rec['memory_need'] / 2**30:.1f} GiB)")
    if "bandwidth" in rec:
        c = f"ceilings measured now: device copy {rec['bandwidth'] / 1e9:,.0f} GB/s"
        if rec.get("flops_rate"):
            c += ", best of cuBLAS " + ", ".join(f"{k} {v / 1e12:.1f}" for k, v in rec["rates"].items()) + " TFLOP/s"
        lines.append(c + f"; bound: {rec['bound']}")
    for s in rec.get("skipped", []):
        lines.append(f"  skipped {s}")
    if rec.get("notes"):
        lines.append(f"  note: {rec['notes']}")
    timing = rec.get("timing", {})
    compute = rec.get("bound") == "compute"
    unit, scale, what = ("TFLOP/s", 1e12, "flops") if compute else ("GB/s", 1e9, "bytes")
    names = list(dict.fromkeys([k for k in ("eager", "torch.compile") if k in timing] + list(rec["rows"])))
    label_of = lambda k: f"{k}->{rec['rungs'][k]}" if rec.get("rungs", {}).get(k, k) != k else k
    w = max([16] + [len(label_of(k)) for k in names])
    lines.append(f"{'':{w}} {'median ms':>9} {'IQR ms':>7} {unit:>8} {'%roof':>6} {'vs eager':>8} {'vs comp':>7} "
                 f"{'host us':>7} {'relL2':>8} {'worst row':>9}  verdict")
    torch_err = max([c.get("torch_rel_l2", 0.0) for r in rec["rows"].values() for c in r["checks"].values()],
                    default=None)
    for k in names:
        t = timing.get(k)
        cols = f"{label_of(k):{w}}"
        if t and "bandwidth" in rec:
            tr = rec["traffic"].get(k, rec["traffic"]["eager"])
            secs = t["median_ms"] * 1e-3
            floor = max(tr["bytes"] / rec["bandwidth"], tr["flops"] / rec["flops_rate"] if rec.get("flops_rate")
                        else 0.0)
            ve = timing["eager"]["median_ms"] / t["median_ms"] if "eager" in timing else float("nan")
            vc = (f"{timing['torch.compile']['median_ms'] / t['median_ms']:.2f}x" if "torch.compile" in timing
                  else "-")
            cols += (f" {t['median_ms']:9.3f} {t['q3_ms'] - t['q1_ms']:7.3f} {tr[what] / secs / scale:8,.0f} "
                     f"{100 * floor / secs:5.1f}% {ve:7.2f}x {vc:>7} {t['host_us']:7.0f}")
        else:
            cols += " " * 62
        r = rec["rows"].get(k)
        if r:
            errs = list(r["checks"].values())
            e = max((c["rel_l2"] for c in errs), default=float("nan"))
            wr = max((c["worst_row"] for c in errs), default=float("nan"))
            v = ("accepted" + (" (pure PyTorch)" if r["pure_torch"] else "")) if r["accepted"] else \
                (f"rejected{' (peer, not gated)' if r['peer'] else ''}: {r['reason']}")
            cols += f" {e:8.1e} {wr:9.1e}  {v}"
        elif k == "eager" and torch_err is not None:
            cols += f" {torch_err:8.1e} {'':9}  (PyTorch fp32's own error, worst call)"
        lines.append(cols)
    for k, r in rec["rows"].items():
        if r.get("own_kernels"):
            lines.append(f"  {k}: own kernels " + "; ".join(f"{kernel_base_name(n)} ({lib})" for n, lib in
                                                           list(r["own_kernels"].items())[:4]))
    n_checks = {k: len(r["checks"]) for k, r in rec["rows"].items()}
    if n_checks:
        lines.append(f"  parity: {max(n_checks.values())} checked calls per row (trials with weight changes, derived "
                     f"inputs, declared cases, timed calls)")
    return "\n".join(lines)
