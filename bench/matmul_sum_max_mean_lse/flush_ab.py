"""Does the way the L2 is flushed, or the judge's rewrite of the inputs before each timed call, change what a call
costs? matmul_sum_max_mean_lse at the benchmark shape (4_overlap through ModelNew, cached and not), a plain read of
its 288 MiB (the bw probe) and a 32 MiB torch copy, each timed after every combination of

  flush:  read (kp.timing.L2Flusher: a sum over 2x the L2), write (fill_ of the same buffer), write + discard
          (then tools/probes/l2.cu drops the buffer's dirty lines: nothing is left to write back), write + discard
          + read;
  before: nothing, or x rewritten in place (as the judge refills each timed call's inputs).

Each sample as kp.timing.bench_interleaved takes it: a preceding call of the same row, the before-step, the flush,
the sleep hold, then the events around the call; combinations interleaved round by round.

  python -m bench.matmul_sum_max_mean_lse.flush_ab
"""
import torch

import harness
import models.matmul_sum_max_mean_lse as lse
from bench.matmul_sum_max_mean_lse.operands import bench_operands

REPS = 25


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    ops = bench_operands()
    x, w, vb = ops.x, ops.w, ops.vb
    x_src = x.clone()
    bw = harness.build_path(harness.PROBES / "bw.cu").ops
    l2 = harness.build_path(harness.PROBES / "l2.cu").ops
    buf = torch.ones(2 * torch.cuda.get_device_properties(0).L2_cache_size // 4, device="cuda")
    sink = torch.empty((), device="cuda")
    other = torch.empty_like(x)
    models = {}
    for cache in (False, True):
        m = lse.ModelNew(ops.I, ops.O, variant="4_overlap", cache=cache).cuda()
        m.load_state_dict(ops.lin.state_dict(prefix="linear."), strict=True)
        models[cache] = m
    rows = {"4_overlap uncached": lambda: models[False](x), "4_overlap cached": lambda: models[True](x),
            "read W + x (bw probe)": lambda: (bw.probe_read(w, vb, ops.nsm, 8, True),
                                              bw.probe_read(x, vb, ops.nsm, 8, True)),
            "torch copy of x (32 MiB)": lambda: other.copy_(x)}
    flushes = {"read": lambda: torch.sum(buf, dim=0, out=sink),
               "write": lambda: buf.fill_(1.0),
               "write + discard": lambda: (buf.fill_(1.0), l2.discard_l2(buf)),
               "write + discard + read": lambda: (buf.fill_(1.0), l2.discard_l2(buf), torch.sum(buf, dim=0, out=sink))}
    befores = {"-": lambda: None, "x rewritten": lambda: x.copy_(x_src)}
    combos = [(r, f, b) for r in rows for f in flushes for b in befores]
    samples = {c: [] for c in combos}
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.no_grad():
        for f in rows.values():
            f()
        torch.cuda.synchronize()
        for _ in range(REPS):
            for c in combos:
                call, flush, before = rows[c[0]], flushes[c[1]], befores[c[2]]
                before()
                call()
                before()
                flush()
                torch.cuda._sleep(harness.HOLD_CYCLES)
                start.record()
                call()
                stop.record()
                stop.synchronize()
                samples[c].append(start.elapsed_time(stop) * 1e3)
    print(f"{torch.cuda.get_device_name()}, {REPS} samples each\n")
    print("| row | flush | before the call | median us | q1 | q3 |\n|---|---|---|---|---|---|")
    for c, v in samples.items():
        t = harness.summarize(v)
        print(f"| {c[0]} | {c[1]} | {c[2]} | {t.median_ms:.1f} | {t.q1_ms:.1f} | {t.q3_ms:.1f} |")


if __name__ == "__main__":
    main()
