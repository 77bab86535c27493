"""What one ModelNew forward costs: host time per call (no sync), GPU time per kernel (torch.profiler), and the
event-timed call with and without an L2 flush before it.

  python -m tools.profile_model --problem matmul_sum_max_mean_lse [--variant V] [--opt cache=False]
"""

import argparse
import time

import torch

import harness
from kp.judge import driver as judge

ap = argparse.ArgumentParser()
ap.add_argument("--problem", required=True)
ap.add_argument("--variant", default=None)
ap.add_argument("--opt", action="append", default=[], help="ModelNew option k=v (v parsed as Python literal)")
args = ap.parse_args()
import ast

mod = harness.problem_module(args.problem)
opts = {k: ast.literal_eval(v) for k, v in (o.split("=", 1) for o in args.opt)}
variant = args.variant or mod.DEFAULT_VARIANT
init = mod.get_init_inputs()
ref = judge.Reference.load(("problem", args.problem))
inputs = ref.inputs(0, "cuda")
m = mod.ModelNew(*init, variant=variant, **opts).cuda()
m.load_state_dict(ref.model(init, 0, "cuda").state_dict())
with torch.no_grad():
    for _ in range(3):
        m(*inputs)
    torch.cuda.synchronize()
    n = 20
    t0 = time.perf_counter()
    for _ in range(n):
        m(*inputs)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    print(
        f"{args.problem}/{variant} {opts}: host {1e6 * (t1 - t0) / n:.1f} us/call (enqueue), "
        f"{1e6 * (t2 - t0) / n:.1f} us/call to completion"
    )
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            m(*inputs)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))
    flush = harness.L2Flusher()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for flushed in (True, False):
        ts = []
        for _ in range(20):
            if flushed:
                flush()
            s.record()
            m(*inputs)
            e.record()
            e.synchronize()
            ts.append(s.elapsed_time(e))
        print(f"event-timed, L2 {'flushed' if flushed else 'warm'}: median {sorted(ts)[10] * 1e3:.1f} us")
