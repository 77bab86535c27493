"""What the L2 flush leaves for the timed call to pay: matmul_sum_max_mean_lse at the benchmark shape (6_phases
and 4_overlap through ModelNew, uncached; 6_phases cached), a plain read of its 288 MiB (the bw probe) and a
32 MiB torch copy, timed by kp.lib.timing.bench_interleaved after each combination of

  flush:  none; read (kp.lib.timing.L2Flusher, the timer's: a sum over 2x the L2); write (fill_ of the same buffer);
          write + discard (then tools/probes/l2.cu drops the buffer's lines without writing them back);
  before: nothing, or the judge's refill of the inputs (x drawn afresh on the device under a new seed by the
          problem's own get_inputs, then copied into the call's input buffer, as the judge does before every call).

Each combination is a bench_interleaved run of its own (rows interleaved within it): mixing flush styles in one
loop would let one combination's dirty lines be paid for by the next.

  python -m bench.matmul_sum_max_mean_lse.flush_ab
"""

import torch

import harness
import models.matmul_sum_max_mean_lse as lse
from bench.matmul_sum_max_mean_lse.operands import bench_operands
from kp.judge.reference import Reference


class WriteFlush:
    """A write of 2x the L2: every earlier line is evicted, the buffer's own stay dirty unless discarded."""

    def __init__(self, discard=None):
        self.buf = harness.L2Flusher().buf
        self.discard = discard

    def __call__(self):
        self.buf.fill_(0.0)
        if self.discard is not None:
            self.discard(self.buf)


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    ops = bench_operands()
    x = ops.x
    ref = Reference.load(("problem", "matmul_sum_max_mean_lse"))
    bw = harness.build_path(harness.PROBES / "bw.cu").ops
    models = {}
    for var, cache in (("6_phases", False), ("4_overlap", False), ("6_phases", True)):
        m = lse.ModelNew(ops.I, ops.O, variant=var, cache=cache).cuda()
        m.load_state_dict(ops.lin.state_dict(prefix="linear."), strict=True)
        models[f"{var} {'cached' if cache else 'uncached'}"] = m
    other = torch.empty_like(x)
    rows = {k: (lambda m=m: m(x)) for k, m in models.items()}
    rows["read W + x (bw probe)"] = lambda: (
        bw.probe_read(ops.w, ops.vb, ops.nsm, 8, True),
        bw.probe_read(x, ops.vb, ops.nsm, 8, True),
    )
    rows["torch copy of x (32 MiB)"] = lambda: other.copy_(x)
    seeds = iter(range(1 << 30))

    def refill(name, rep):
        (src,) = ref.inputs(next(seeds), "cuda")
        x.copy_(src)

    l2 = harness.build_path(harness.PROBES / "l2.cu").ops
    flushes = {
        "none": lambda: None,
        "read": harness.L2Flusher(),
        "write": WriteFlush(),
        "write + discard": WriteFlush(l2.discard_l2),
    }
    befores = {"-": None, "inputs refilled": refill}
    res = {}
    with torch.no_grad():
        for fn, flush in flushes.items():
            for bn, before in befores.items():
                res[(fn, bn)] = harness.bench_interleaved(
                    rows, min_reps=20, max_reps=40, budget_s=15, before=before, flush=flush
                )
    print(f"{torch.cuda.get_device_name()}, median us (IQR)\n")
    print("| flush | before the call | " + " | ".join(rows) + " |\n|---|---|" + "---|" * len(rows))
    for (fn, bn), t in res.items():
        print(
            f"| {fn} | {bn} | "
            + " | ".join(f"{1e3 * t[k].median_ms:.1f} ({1e3 * t[k].iqr_ms:.1f})" for k in rows)
            + " |"
        )


if __name__ == "__main__":
    main()
