#!/usr/bin/env python3
"""Bandwidth curve of softmax: columns 1K..393K at a fixed ~6.4 GB of input, eager vs torch.compile vs rungs.

GB/s counts the minimum traffic (read x once + write y once), as QuACK plots it. Prints a markdown table.
  python scripts/softmax_sweep.py [--cols 1024,4096,...] [--variants 2_online,3_cluster]
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import harness  # noqa: E402
from models.softmax import Model, ModelNew  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--cols", default="1024,2048,4096,8192,16384,32768,65536,131072,262144,393216")
ap.add_argument("--variants", default="2_online,3_cluster,4_persistent,5_regrow,auto")
ap.add_argument("--total-bytes", type=float, default=4096 * 393216 * 4)
args = ap.parse_args()

ceiling = harness.copy_bandwidth()
variants = args.variants.split(",")
print(f"copy ceiling {ceiling / 1e9:,.0f} GB/s")
head = "auto" if "auto" in variants else None  # what ModelNew() runs; else the best listed variant
print("| cols | rows | eager GB/s | compile GB/s | " + " | ".join(f"{v} GB/s" for v in variants) +
      f" | {head or 'best'} % of copy | {head or 'best'} vs compile |")
print("|---" * (5 + len(variants)) + "|")
for cols in (int(c) for c in args.cols.split(",")):
    rows = int(args.total_bytes // (cols * 4))
    x = torch.rand(rows, cols, device="cuda")
    fns = {"eager": Model(), "compile": torch.compile(Model(), dynamic=False)}
    fns.update({v: ModelNew(variant=v) for v in variants})
    with torch.no_grad():
        t = harness.bench_interleaved({k: (lambda m=m: m(x)) for k, m in fns.items()}, min_reps=5, max_reps=20,
                                      budget_s=6)
    gbs = {k: 2 * x.numel() * 4 / (v.median_ms * 1e-3) / 1e9 for k, v in t.items()}
    best = gbs[head] if head else max(gbs[v] for v in variants)
    print(f"| {cols} | {rows} | {gbs['eager']:,.0f} | {gbs['compile']:,.0f} | "
          + " | ".join(f"{gbs[v]:,.0f}" for v in variants)
          + f" | {100 * best * 1e9 / ceiling:.1f}% | {best / gbs['compile']:.2f}x |", flush=True)
    del x
    torch.cuda.empty_cache()
