"""Hardware counters per kernel (`run.py --ncu`): one call of each row under Nsight Compute, in a fresh process.

ncu starts a child interpreter (`python -m kp.observe.ncu SPEC`) that builds the same rows as the judge (the eager and
torch.compile baselines, the playground's variants, a candidate that runs unsandboxed), warms each with one call,
then, between cudaProfilerStart and Stop, makes one call of each row with a marker kernel (`torch.cuda._sleep`,
named spin_kernel) before it. The marker splits ncu's kernel list into rows.

ncu's own settings: `--clock-control none` (the GPU's clocks as the timing saw them) and its default cache control,
which flushes the caches before every kernel: each kernel's DRAM bytes are those of a cold start, so a row of several
kernels that pass data through L2 in a warm call is charged as if they did not. Writes still held in L2 when a
kernel ends are not DRAM bytes yet: an output smaller than L2 reads below 1.00x of the minimum (a 32 MiB ReLU on an
H100's 50 MiB L2: 0.70x). Each kernel is replayed once per counter pass; its time here is ncu's, not the timing
table's.

Per kernel: DRAM bytes read and written, achieved DRAM bandwidth (read + write over its time) against the copy
ceiling the run measured, SM and tensor-pipe throughput (% of peak, elapsed), registers per thread, local-memory
bytes (register spills and local arrays: traffic through L1, not a count of spilled registers), achieved occupancy.
Per row: DRAM bytes against the minimum the problem declares (`traffic()` bytes: 1.00x = no byte wasted).

A boxed candidate is not profiled: ncu's injection cannot reach into the box, and running it outside would run an
untrusted file unsandboxed. `--no-sandbox` includes it.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

MARKER = "spin_kernel"  # torch.cuda._sleep's kernel

# key -> ncu metric; ncu reports each counter's .avg/.max/.min/.sum, the name below is the column read.
METRICS = {
    "dram_read": "dram__bytes_read.sum",
    "dram_write": "dram__bytes_write.sum",
    "time_ns": "gpu__time_duration.sum",
    "sm_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "tensor_pct": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
    "regs": "launch__registers_per_thread",
    "local_ld": "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",
    "local_st": "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",
    "occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
}
# Messages by which ncu says it cannot read the counters here (permissions, a sandboxed runtime).
REFUSALS = (
    "ERR_NVGPUCTRPERM",
    "LibraryNotLoaded",
    "Failed to initialize the profiler",
    "not supported",
    "Profiling is not supported",
)


def ncu_path() -> str | None:
    return os.environ.get("KP_NCU") or shutil.which("ncu")


def version(path: str) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    m = re.search(r"Version\s+(\S+)", out)
    return m.group(1) if m else (out.strip().splitlines() or ["?"])[-1]


def command(path: str, spec_file: str) -> list[str]:
    return [
        path,
        "--clock-control",
        "none",
        "--profile-from-start",
        "off",
        "--csv",
        "--page",
        "raw",
        "--metrics",
        ",".join(METRICS.values()),
        sys.executable,
        "-m",
        "kp.observe.ncu",
        spec_file,
    ]


def _number(s: str) -> float | None:
    s = s.replace(",", "").strip()
    try:
        return float(s)
    except ValueError:
        return None


def parse_csv(text: str) -> list[dict]:
    """ncu's `--csv --page raw` output -> one dict per profiled kernel, in launch order: id, name, and METRICS'
    keys (None where the column is missing). Lines before the header (ncu's ==PROF== notes, the program's own
    output) and the units row are skipped."""
    lines = text.splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.startswith('"ID",')]
    if not starts:
        return []
    rows = list(csv.reader(io.StringIO("\n".join(ln for ln in lines[starts[-1] :] if not ln.startswith("==")))))
    head, out = rows[0], []
    col = {name: i for i, name in enumerate(head)}
    for r in rows[1:]:
        if len(r) != len(head) or not r[col["ID"]].strip():  # the units row
            continue
        k = {"id": int(_number(r[col["ID"]])), "name": r[col["Kernel Name"]]}
        for key, metric in METRICS.items():
            k[key] = _number(r[col[metric]]) if metric in col else None
        out.append(k)
    return out


def split_rows(kernels: list[dict], labels: list[str]) -> dict[str, list[dict]]:
    """The kernels after each marker belong to that marker's row (labels in call order)."""
    marks = [i for i, k in enumerate(kernels) if MARKER in k["name"]]
    if len(marks) != len(labels):
        raise ValueError(f"expected {len(labels)} marker kernels, ncu saw {len(marks)}")
    bounds = marks + [len(kernels)]
    return {lab: kernels[bounds[i] + 1 : bounds[i + 1]] for i, lab in enumerate(labels)}


def summarize(per_row: dict[str, list[dict]], min_bytes: dict[str, float], copy_bw: float | None) -> dict:
    """Per row: its kernels (with DRAM bandwidth as % of copy_bw) and totals; bytes against the row's minimum."""
    out = {}
    for label, ks in per_row.items():
        items = []
        for k in ks:
            moved = (k["dram_read"] or 0) + (k["dram_write"] or 0)
            t = (k["time_ns"] or 0) * 1e-9
            bw = moved / t if t else None
            items.append(
                {
                    **k,
                    "dram_bw": bw,
                    "dram_pct": 100 * bw / copy_bw if bw and copy_bw else None,
                    "local_bytes": (k["local_ld"] or 0) + (k["local_st"] or 0),
                }
            )
        read = sum(k["dram_read"] or 0 for k in ks)
        write = sum(k["dram_write"] or 0 for k in ks)
        floor = min_bytes.get(label)
        out[label] = {
            "kernels": items,
            "dram_read": read,
            "dram_write": write,
            "time_ns": sum(k["time_ns"] or 0 for k in ks),
            "min_bytes": floor,
            "x_min": (read + write) / floor if floor else None,
        }
    return out


def _f(v, fmt: str) -> str:
    return format(v, fmt) if v is not None else "-"


def format_ncu(res: dict, width: int = 44) -> list[str]:
    """The table's ncu section."""
    from kp.observe.profile import kernel_base_name

    if res.get("error"):
        return [f"  ncu: {res['error']}"]
    lines = [
        f"  ncu {res.get('version', '')} (clocks as they were, caches flushed before each kernel; "
        f"DRAM GB/s % of the copy ceiling {res['copy_bw'] / 1e9:,.0f} GB/s):"
        if res.get("copy_bw")
        else f"  ncu {res.get('version', '')} (clocks as they were, caches flushed before each kernel):"
    ]
    for note in res.get("notes", []):
        lines.append(f"  ncu: {note}")
    for label, r in res["rows"].items():
        xm = f", {r['x_min']:.2f}x the minimum {r['min_bytes'] / 1e9:,.3f} GB" if r["x_min"] else ""
        lines.append(
            f"  ncu {label}: {len(r['kernels'])} kernels, {r['time_ns'] / 1e6:.3f} ms, DRAM "
            f"{r['dram_read'] / 1e9:,.3f} GB read + {r['dram_write'] / 1e9:,.3f} GB written{xm}"
        )
        if r["kernels"]:
            lines.append(
                f"    {'kernel':{width}s} {'ms':>7s} {'rd GB':>7s} {'wr GB':>7s} {'%copy':>6s} "
                f"{'SM%':>5s} {'TC%':>5s} {'regs':>4s} {'local B':>8s} {'occ%':>5s}"
            )
        for k in r["kernels"]:
            lines.append(
                f"    {kernel_base_name(k['name'])[:width]:{width}s} "
                f"{_f(k['time_ns'] and k['time_ns'] / 1e6, '7.3f')} "
                f"{_f(k['dram_read'] and k['dram_read'] / 1e9, '7.3f')} "
                f"{_f(k['dram_write'] and k['dram_write'] / 1e9, '7.3f')} {_f(k['dram_pct'], '6.1f')} "
                f"{_f(k['sm_pct'], '5.1f')} {_f(k['tensor_pct'], '5.1f')} {_f(k['regs'], '4.0f')} "
                f"{_f(k['local_bytes'], '8.0f')} {_f(k['occupancy_pct'], '5.1f')}"
            )
    return lines


def refusal(stderr: str) -> str | None:
    for ln in stderr.splitlines():
        if any(r in ln for r in REFUSALS):
            return ln.strip()[:300]
    return None


def run(spec: dict, min_bytes: dict[str, float], copy_bw: float | None, timeout: float = 900) -> dict:
    """Run the spec's rows under ncu (see the module docstring); {"error": why} when ncu is absent, refuses, or
    its output cannot be read -- never an exception: the rest of the run goes on."""
    path = ncu_path()
    if path is None:
        return {"error": "Nsight Compute (ncu) not found on PATH (or KP_NCU): no hardware counters"}
    with tempfile.TemporaryDirectory(prefix="kp_ncu_") as d:
        spec_file = os.path.join(d, "spec.json")
        spec = {**spec, "labels_out": os.path.join(d, "labels.json")}
        with open(spec_file, "w") as f:
            json.dump(spec, f)
        try:
            p = subprocess.run(command(path, spec_file), capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"ncu did not finish in {timeout:.0f} s"}
        except OSError as e:
            return {"error": f"ncu could not start: {e}"}
        why = refusal(p.stderr + p.stdout)
        if why and not os.path.exists(spec["labels_out"]):
            return {"error": f"ncu cannot read the counters here: {why}"}
        if not os.path.exists(spec["labels_out"]):
            tail = (p.stderr.strip().splitlines() or [f"exit code {p.returncode}"])[-1]
            return {"error": f"the profiled process failed: {tail[:300]}"}
        with open(spec["labels_out"]) as f:
            labels = json.load(f)
    try:
        per_row = split_rows(parse_csv(p.stdout), labels)
    except (ValueError, KeyError) as e:
        return {"error": f"ncu's output could not be read: {e}"}
    return {
        "version": version(path),
        "copy_bw": copy_bw,
        "rows": summarize(per_row, min_bytes, copy_bw),
        "notes": spec.get("notes", []),
    }


def main(spec_file: str) -> None:
    """The profiled process: build the rows as the judge did, warm them, then one marked call of each."""
    import torch
    from kp.lib.registry import variant_factory
    from kp.worker.loop import Worker

    with open(spec_file) as f:
        spec = json.load(f)
    ref_spec, precision, init, seed = tuple(spec["ref_spec"]), spec["precision"], spec["init"], spec["seed"]
    w = Worker(ref_spec, "cuda", precision)
    st = w.state
    mod = st.ref.module
    for r in spec["rows"]:
        if r.get("candidate"):
            if not w.run("load", r["candidate"])["has_model_new"]:
                continue
            st.factories[r["label"]] = st.factories.pop("candidate")
        else:
            st.factories[r["label"]] = variant_factory(mod, r["variant"], r["opts"], precision)
    state = st.ref.model(init, seed, "cuda").state_dict()
    w.run("baselines", init, seed, state, spec["compile"], seed)
    labels = []
    for label in st.factories:
        w.run("build", label, init, seed)
        m = st.models[label]
        if isinstance(m, torch.nn.Module):
            try:
                m.load_state_dict(state)  # the reference's weights, as the judge gives them
            except RuntimeError:
                pass
        labels.append(label)
    x = st.ref.inputs(seed, "cuda")
    rows = st.with_baselines(labels)
    with torch.no_grad():
        for m in rows.values():
            m(*x)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        for m in rows.values():
            torch.cuda._sleep(1000)
            m(*x)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    with open(spec["labels_out"], "w") as f:
        json.dump(list(rows), f)


if __name__ == "__main__":
    main(sys.argv[1])
