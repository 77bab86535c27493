"""Bandwidth curve of softmax: columns 1K..393K at a fixed ~6.4 GB of input, eager vs torch.compile vs rungs.

GB/s counts the minimum traffic (read x once + write y once), as QuACK plots it. Prints a markdown table.
  python bench/softmax/sweep.py [--cols 1024,4096,...] [--variants 2_online,3_cluster]
"""

import argparse
import sys

import torch

import harness
from models.softmax import Model, ModelNew

ap = argparse.ArgumentParser()
ap.add_argument("--cols", default="1024,2048,4096,8192,16384,32768,65536,131072,262144,393216")
ap.add_argument("--variants", default="2_online,3_cluster,4_persistent,5_regrow,auto")
ap.add_argument("--total-bytes", type=float, default=4096 * 393216 * 4)
ap.add_argument("--regrow-ab", action="store_true", help="A/B 5_regrow's launch shapes at 1024 columns, then exit")
ap.add_argument(
    "--order-ab",
    action="store_true",
    help="A/B 6_regcluster's static vs ticketed row order at 4096x393216 next to copy_, eager and compile, then exit",
)
ap.add_argument(
    "--stagger-ab",
    action="store_true",
    help="A/B 6_regcluster's start stagger at 4096x393216 next to "
    "copy_, eager and compile, and on short runs (15, 60, 240 rows), then exit",
)
ap.add_argument(
    "--cl-ab",
    action="store_true",
    help="A/B 6_regcluster's cluster size rule (smallest that holds the "
    "row vs smallest power of two) where they differ, next to copy_ and compile, then exit",
)
ap.add_argument(
    "--tail-ab",
    action="store_true",
    help="A/B 6_regcluster at lengths just past a multiple of its "
    "register slice: the cluster the slices alone need vs a smaller one with a tail in shared memory, "
    "next to copy_ and compile, then exit",
)
ap.add_argument(
    "--mode-ab",
    action="store_true",
    help="A/B 6_regcluster's row load paths (direct loads, bulk "
    "copies of aligned slices, bulk copies of the aligned window around any slice) next to copy_ and "
    "compile, at lengths that are and are not multiples of 4, then exit",
)
ap.add_argument(
    "--half-probe",
    action="store_true",
    help="what bounds 6_regcluster's bf16 rows at 4096x393216: "
    "both output paths (stores from registers, staged) next to builds with a multiply in place of each "
    "exp, with no stores, and both (outputs not softmax: timed, not checked), next to copy_, eager and "
    "compile, then exit",
)
ap.add_argument(
    "--half-ab",
    action="store_true",
    help="A/B 6_regcluster's 16-bit rows at 4096x393216 (bf16, then "
    "fp16): the output staged in shared memory or stored from registers, one or two rows ahead in the "
    "ring, next to copy_, eager and compile, then exit",
)
ap.add_argument(
    "--half-cta-ab",
    action="store_true",
    help="A/B 6_regcluster at 4096x393216 (bf16, fp16, fp32): "
    "the shipped 512-thread CTAs (one an SM, 8-CTA clusters) against half-size ones (256 threads, two an "
    "SM, 16-CTA clusters), next to copy_, eager and compile, then exit",
)
args = ap.parse_args()


def ab_at(cols, paths_of, budget_s=6):
    """One A/B shape (~total_bytes of input, `cols` columns): paths_of(x, y) -> {name: f()}, each f writing
    softmax(x) into y; each path is checked against float64 on ~40 rows, then all are timed next to copy_ and
    torch.compile of the same x (interleaved, L2 flushed). Returns (rows, {name: GB/s}), one read + one write."""
    rows = int(args.total_bytes // (cols * 4))
    x = torch.rand(rows, cols, device="cuda")
    y = torch.empty_like(x)
    paths = paths_of(x, y)
    pick = slice(0, rows, max(1, rows // 40))
    ref = torch.softmax(x[pick].double(), 1)
    for name, f in paths.items():
        y.zero_()
        f()
        e = harness.rel_error(y[pick], ref)
        assert e.rel_l2 < 1e-6 and e.worst_row < 1e-6, (cols, name, e)
    torch._dynamo.reset()
    compiled = torch.compile(Model(), dynamic=False)
    with torch.no_grad():
        t = harness.bench_interleaved(
            {"copy_": lambda x=x, y=y: y.copy_(x), "compile": lambda x=x: compiled(x), **paths},
            min_reps=8,
            max_reps=20,
            budget_s=budget_s,
        )
    gbs = {k: 2 * x.numel() * 4 / (v.median_ms * 1e-3) / 1e9 for k, v in t.items()}
    del x, y, ref, paths, compiled
    torch.cuda.empty_cache()
    return rows, gbs


if args.mode_ab:
    k6 = harness.Kernel("softmax", "6_regcluster", experiments=True)
    names = {0: "direct", 1: "bulk", 2: "window"}
    print(
        "| cols | rows | copy_ GB/s | compile GB/s | direct GB/s | bulk GB/s | window GB/s | window % of copy_ |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    for cols in (131073, 262147, 98309, 196613, 393219, 131072, 393216):
        modes = [0, 2] + ([1] if cols % 4 == 0 else [])
        rows, g = ab_at(
            cols, lambda x, y: {names[md]: (lambda md=md: k6.softmax_forward_mode(x, y, md)) for md in modes}
        )
        cell = lambda k: f"{g[k]:,.0f}" if k in g else "-"  # noqa: E731
        print(
            f"| {cols} | {rows} | {cell('copy_')} | {cell('compile')} | {cell('direct')} | {cell('bulk')} | "
            f"{cell('window')} | {100 * g['window'] / g['copy_']:.1f}% |",
            flush=True,
        )
    sys.exit(0)

if args.tail_ab:
    k6 = harness.Kernel("softmax", "6_regcluster", experiments=True)
    k4 = harness.Kernel("softmax", "4_persistent")
    print(
        "| cols | rows | cl without / with tail | copy_ GB/s | compile GB/s | without tail GB/s | with tail GB/s | "
        "with tail % of copy_ |\n|---|---|---|---|---|---|---|---|"
    )
    for cols in (98308, 196612, 98309, 196613, 393220, 50000, 786440, 393216):
        pad = 0 if cols % 4 == 0 else 4

        def smallest(cap):
            return next((c for c in (1, 2, 3, 4, 8, 16) if (-(-cols // c) + 3) // 4 * 4 + pad <= cap), 0)

        old, new = smallest(49152), smallest(49152 + 4096)
        if pad and old and old < 2 * new:  # the kernel's rule: a window takes the tail only where it halves the cluster
            new = old

        def paths(x, y):
            # without a tail: the cluster the registers alone need, or (no cluster holds the row) 4_persistent
            plain = (lambda: k6.softmax_forward_cluster(x, y, old, True)) if old else (lambda: k4.softmax_forward(x, y))
            return {"plain": plain, "tail": lambda: k6.softmax_forward_cluster(x, y, 0, True)}

        rows, g = ab_at(cols, paths)
        print(
            f"| {cols} | {rows} | {old or '4_persistent'} / {new} | {g['copy_']:,.0f} | {g['compile']:,.0f} | "
            f"{g['plain']:,.0f} | {g['tail']:,.0f} | {100 * g['tail'] / g['copy_']:.1f}% |",
            flush=True,
        )
    sys.exit(0)

if args.cl_ab:
    k6 = harness.Kernel("softmax", "6_regcluster", experiments=True)
    print(
        "| cols | rows | cl pow2 | copy_ GB/s | compile GB/s | pow2 GB/s | rule (cl=0) GB/s | rule / pow2 |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    for cols in (98308, 131072, 147456):  # where the rule (3) and the power of two (4) differ
        p2 = 1
        while -(-cols // p2) > 49152:
            p2 *= 2
        rows, g = ab_at(
            cols,
            lambda x, y: {
                "pow2": lambda: k6.softmax_forward_cluster(x, y, p2, True),
                "rule": lambda: k6.softmax_forward_cluster(x, y, 0, True),
            },
            budget_s=8,
        )
        print(
            f"| {cols} | {rows} | {p2} | {g['copy_']:,.0f} | {g['compile']:,.0f} | {g['pow2']:,.0f} | "
            f"{g['rule']:,.0f} | {g['rule'] / g['pow2']:.3f} |",
            flush=True,
        )
    sys.exit(0)


def bench_shape_ab(calls, budget_s, dtype=torch.float32, unchecked=()):
    """calls (name -> (f(x, y), rows it covers)) at the benchmark shape, 4096x393216 of dtype, next to copy_, eager
    and torch.compile in one interleaved loop; a markdown table of ms, GB/s and % of copy_ (per byte moved). Calls
    that cover every row are first checked against float64 on rows 0::97 (a float64 reference of all 4096 would be
    12.9 GB more): fp32 within 1e-6; 16-bit rows within 1.01 x eager's own error on the same rows (both compute in
    fp32 and round once, so they differ only where the fp32 sums do). Calls named in `unchecked` are probes whose
    output is not softmax: timed only."""
    x = torch.rand(4096, 393216, device="cuda").to(dtype)
    y = torch.empty_like(x)
    pick = slice(0, 4096, 97)
    ref = torch.softmax(x[pick].double(), 1)
    own = harness.rel_error(torch.softmax(x[pick], 1), ref)
    compiled = torch.compile(Model(), dynamic=False)
    fns = {"copy_": lambda: y.copy_(x), "eager": lambda: torch.softmax(x, 1), "compile": lambda: compiled(x)}
    covered = dict.fromkeys(fns, 4096)
    for name, (f, rows) in calls.items():
        if rows == 4096 and name not in unchecked:
            y.zero_()
            f(x, y)
            e = harness.rel_error(y[pick], ref)
            if dtype == torch.float32:
                assert e.rel_l2 < 1e-6 and e.worst_row < 1e-6, (name, e)
            else:
                assert e.rel_l2 <= 1.01 * own.rel_l2 and e.worst_row <= 1.01 * own.worst_row, (name, e, own)
        fns[name] = lambda f=f: f(x, y)
        covered[name] = rows
    print("parity ok (rows 0::97 vs float64)", flush=True)
    with torch.no_grad():
        t = harness.bench_interleaved(fns, min_reps=10, max_reps=30, budget_s=budget_s)
    cp = t["copy_"].median_ms
    print(
        f"| 4096x393216 {str(dtype).replace('torch.', '')} | median ms | IQR ms | GB/s | % of copy_ |\n"
        "|---|---|---|---|---|"
    )
    for n, v in t.items():
        share = covered[n] / 4096
        gbs = share * 2 * x.numel() * x.element_size() / (v.median_ms * 1e-3) / 1e9
        print(f"| {n} | {v.median_ms:.4f} | {v.iqr_ms:.4f} | {gbs:,.0f} | {100 * share * cp / v.median_ms:.1f}% |")


if args.stagger_ab:
    k6 = harness.Kernel("softmax", "6_regcluster", experiments=True)
    none = torch.empty(0, dtype=torch.int64, device="cuda")
    staggers = {
        -1: "start stagger by rule (shipped)",
        0: "no stagger",
        400: "stagger 400 cycles/cluster",
        1600: "stagger 1600 cycles/cluster",
    }
    calls = {name: (lambda x, y, st=st: k6.softmax_forward_ab(x, y, none, st), 4096) for st, name in staggers.items()}
    for r in (15, 60, 240):  # short runs: 1, 4 and 16 rows per cluster
        for st in (-1, 0, 768):
            calls[f"first {r} rows, stagger {'rule' if st < 0 else st}"] = (
                lambda x, y, r=r, st=st: k6.softmax_forward_ab(x[:r], y[:r], none, st),
                r,
            )
    bench_shape_ab(calls, budget_s=60)
    sys.exit(0)

if args.half_probe:
    k6 = harness.Kernel("softmax", "6_regcluster", experiments=True)
    probes = {
        "stores from registers": 0,
        "stores from registers, probe: a multiply in place of each exp": 1,
        "probe: no stores": 2,
        "probe: no exp, no stores": 3,
        "staged output": 4,
        "staged output, probe: a multiply in place of each exp": 5,
    }
    bench_shape_ab(
        {n: (lambda x, y, p=p: k6.softmax_forward_probe(x, y, p), 4096) for n, p in probes.items()},
        budget_s=30,
        dtype=torch.bfloat16,
        unchecked=[n for n, p in probes.items() if p % 4],
    )
    sys.exit(0)

if args.half_ab:
    k6 = harness.Kernel("softmax", "6_regcluster", experiments=True)
    # The shipped rule (one row ahead; the output staged in shared memory and sent by bulk copies, or stored from
    # registers, by the GPU's bandwidth an SM) next to both forced, and two rows ahead (2 x 96 KiB, an A/B build).
    cases = {
        "shipped (the rule picks by the GPU)": (-1, 0),
        "one row ahead, output staged": (1, 1),
        "one row ahead, stores from registers": (0, 1),
        "two rows ahead, stores from registers": (0, 2),
    }
    for dt in (torch.bfloat16, torch.float16):
        bench_shape_ab(
            {n: (lambda x, y, so=so, d=d: k6.softmax_forward_store(x, y, so, d), 4096) for n, (so, d) in cases.items()},
            budget_s=30,
            dtype=dt,
        )
    sys.exit(0)

if args.half_cta_ab:
    k6 = harness.Kernel("softmax", "6_regcluster", experiments=True)
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        cases = {
            "shipped": lambda x, y: k6.softmax_forward_store(x, y, -1, 0),
            "half CTAs, stores from registers": lambda x, y: k6.softmax_forward_half_cta(x, y, 0, 1),
        }
        if dt != torch.float32:
            cases["half CTAs, output staged"] = lambda x, y: k6.softmax_forward_half_cta(x, y, 1, 1)
            cases["half CTAs, two rows ahead"] = lambda x, y: k6.softmax_forward_half_cta(x, y, 0, 2)
        bench_shape_ab({n: (f, 4096) for n, f in cases.items()}, budget_s=25, dtype=dt)
    sys.exit(0)

if args.order_ab:
    k6 = harness.Kernel("softmax", "6_regcluster", experiments=True)
    bench_shape_ab(
        {
            f"6_regcluster {'ticket' if tk else 'static'} order": (
                lambda x, y, tk=tk: k6.softmax_forward_cluster(x, y, 0, tk),
                4096,
            )
            for tk in (False, True)
        },
        budget_s=40,
    )
    sys.exit(0)

if args.regrow_ab:
    cols = 1024
    x = torch.rand(int(args.total_bytes // (cols * 4)), cols, device="cuda")
    y = torch.empty_like(x)
    k = harness.Kernel("softmax", "5_regrow", experiments=True)
    ref = torch.softmax(x, 1)
    compiled = torch.compile(Model(), dynamic=False)
    fns = {"eager": lambda: torch.softmax(x, 1), "compile": lambda: compiled(x), "copy_": lambda: y.copy_(x)}
    names = [
        "V8 W1 256 thr (shipped)",
        "V8 W1 128 thr",
        "V8 W1 128 thr + hints",
        "V8 W1 256 thr + hints",
        "V8 W1 512 thr",
        "V1 W8 256 thr",
        "V2 W4 256 thr",
        "V4 W2 256 thr",
        "V2 W4 128 thr",
    ]
    for cfg, name in enumerate(names):
        y.zero_()
        k.softmax_forward_ab(x, y, cfg)
        assert harness.rel_error(y, ref).rel_l2 < 1e-6, name
        fns[name] = lambda cfg=cfg: k.softmax_forward_ab(x, y, cfg)
    with torch.no_grad():
        t = harness.bench_interleaved(fns, min_reps=10, max_reps=30, budget_s=30)
    print(f"| 5_regrow A/B at {x.shape[0]}x{cols} | median ms | GB/s |\n|---|---|---|")
    for n, v in t.items():
        print(f"| {n} | {v.median_ms:.3f} | {2 * x.numel() * 4 / (v.median_ms * 1e-3) / 1e9:,.0f} |")
    sys.exit(0)

ceiling = harness.copy_bandwidth()
variants = args.variants.split(",")
print(f"copy ceiling {ceiling / 1e9:,.0f} GB/s")
head = "auto" if "auto" in variants else None  # what ModelNew() runs; else the best listed variant
print(
    "| cols | rows | eager GB/s | compile GB/s | "
    + " | ".join(f"{v} GB/s" for v in variants)
    + f" | {head or 'best'} % of copy | {head or 'best'} vs compile |"
)
print("|---" * (5 + len(variants)) + "|")
for cols in (int(c) for c in args.cols.split(",")):
    rows = int(args.total_bytes // (cols * 4))
    x = torch.rand(rows, cols, device="cuda")
    # A fresh dynamo cache per shape: after 8 shapes of one forward, dynamo stops compiling (recompile_limit) and
    # silently runs eager, which made the compile column of long sweeps equal to eager.
    torch._dynamo.reset()
    fns = {"eager": Model(), "compile": torch.compile(Model(), dynamic=False)}
    fns.update({v: ModelNew(variant=v) for v in variants})
    with torch.no_grad():
        t = harness.bench_interleaved(
            {k: (lambda m=m: m(x)) for k, m in fns.items()}, min_reps=5, max_reps=20, budget_s=6
        )
    gbs = {k: 2 * x.numel() * 4 / (v.median_ms * 1e-3) / 1e9 for k, v in t.items()}
    best = gbs[head] if head else max(gbs[v] for v in variants)
    print(
        f"| {cols} | {rows} | {gbs['eager']:,.0f} | {gbs['compile']:,.0f} | "
        + " | ".join(f"{gbs[v]:,.0f}" for v in variants)
        + f" | {100 * best * 1e9 / ceiling:.1f}% | {best / gbs['compile']:.2f}x |",
        flush=True,
    )
    del x
    torch.cuda.empty_cache()
