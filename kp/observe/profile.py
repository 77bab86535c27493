"""Where a call's time goes (`run.py --profile`): the kernels one call of a row launched, from PyTorch's profiler,
grouped by name with their count, GPU time and share of the call's GPU time. On the CPU (`--device cpu`) the same
table lists the operators by their own (self) CPU time. The escape check reads the same GPU events."""

from __future__ import annotations

import json
import os
import tempfile

GPU_KINDS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}


def profiler(gpu: bool = True):
    """PyTorch's profiler (kineto) recording the GPU's activities (gpu=False: the CPU's operators), as a context
    manager with export_chrome_trace and key_averages. The autograd profiler that torch.profiler.profile wraps: the
    wrapper's start reads a torch._inductor setting, which imports torch._inductor and torch._dynamo on first use
    (4.3 s of a small job's start on an H200 host), for nothing a profile here reads."""
    from torch.autograd import profiler as autograd_profiler

    return autograd_profiler.profile(use_cpu=not gpu, use_device="cuda" if gpu else None, use_kineto=True)


def kernel_base_name(name: str) -> str:
    """'void kp::softmax_kernel<8>(float const*, ...)' -> 'softmax_kernel' (what a symbol table contains)."""
    s = name.strip().replace("(anonymous namespace)", "anon").replace("<unnamed>", "anon")  # profiler / ncu
    for prefix in ("void ", "__global__ "):
        if s.startswith(prefix):
            s = s[len(prefix) :]
    cut = next((i for i, ch in enumerate(s) if ch in "(<"), len(s))  # parameters or template arguments end the name
    return s[:cut].split("::")[-1].strip()


def gpu_events(prof) -> list[dict]:
    """The GPU activities of a finished profile, in time order: name, kind (kernel / memcpy / memset), start and
    duration in microseconds, stream."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            return trace_events(json.load(f))


def trace_events(trace: dict) -> list[dict]:
    """gpu_events from a Chrome trace as the profiler exports it."""
    out = []
    for e in trace.get("traceEvents", []):
        k = GPU_KINDS.get(str(e.get("cat", "")).lower())
        if k and e.get("ph") == "X":
            args = e.get("args", {})
            out.append(
                {
                    "name": e.get("name", ""),
                    "kind": k,
                    "ts": float(e["ts"]),
                    "dur": float(e.get("dur", 0)),
                    "stream": args.get("stream"),
                }
            )
    out.sort(key=lambda e: e["ts"])
    return out


def cpu_ops(prof) -> list[dict]:
    """The operators of a finished CPU profile as events of their own time (self time: nested operators are not
    counted twice)."""
    return [
        {"name": a.key, "kind": "cpu op", "dur": float(a.self_cpu_time_total), "count": int(a.count)}
        for a in prof.key_averages()
        if a.self_cpu_time_total > 0
    ]


def summarize(events: list[dict]) -> dict:
    """Events grouped by name: count, total microseconds and share of all of them, longest first."""
    groups: dict[str, dict] = {}
    for e in events:
        g = groups.setdefault(e["name"], {"name": e["name"], "kind": e["kind"], "count": 0, "us": 0.0})
        g["count"] += e.get("count", 1)
        g["us"] += e["dur"]
    total = sum(g["us"] for g in groups.values())
    items = sorted(groups.values(), key=lambda g: -g["us"])
    for g in items:
        g["share"] = g["us"] / total if total else 0.0
    return {"total_us": total, "items": items}


def format_profile(profiles: dict[str, dict], top: int = 6, width: int = 70) -> list[str]:
    """The table's profile section: per row, its total and its longest items."""
    lines = []
    for label, p in profiles.items():
        items = p["items"]
        what = "GPU" if not items or items[0]["kind"] != "cpu op" else "CPU (self time)"
        lines.append(
            f"  profile {label}: {len(items)} distinct, {sum(i['count'] for i in items)} launched, "
            f"{p['total_us'] / 1e3:.3f} ms {what}"
        )
        for i in items[:top]:
            lines.append(
                f"    {100 * i['share']:5.1f}% {i['us'] / 1e3:9.3f} ms x{i['count']:<4d} {i['kind']:7s} "
                f"{kernel_base_name(i['name'])[:width]}"
            )
        if len(items) > top:
            rest = items[top:]
            lines.append(
                f"    {100 * sum(i['share'] for i in rest):5.1f}% {sum(i['us'] for i in rest) / 1e3:9.3f} ms "
                f"in {len(rest)} more"
            )
    return lines
