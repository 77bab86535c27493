"""The shipped kernels, run three times per call (the first two results thrown away), and between the second and the
third the timer's own start event recorded again, found by walking up into the timing loop's frame: nothing is
replaced and the samples are told as taken, but each covers a third of the call's GPU work. The escape stage's
profile of the same call (activity records made outside Python) shows the work the events missed."""
import sys

import torch

from models.matmul_sum_max_mean_lse import ModelNew as _Shipped

PROBLEM = "matmul_sum_max_mean_lse"
EXPECT = r"timing: median .* is under 0\.5 x the .* the profiler saw the call's own GPU work take"
KIND = "timing"
DEVICES = ("cuda",)
# the defect is a third of each call's GPU work missed by the events: at the benchmark's batch that work is long
# enough for the profiler's figure to stand clear of launch overheads
BENCH_SHAPE = "the timed work must dwarf launch overheads for the profiler's comparison"


class ModelNew(_Shipped):
    def forward(self, x):
        super().forward(x)
        super().forward(x)
        f = sys._getframe(1)
        while f is not None and not isinstance(f.f_locals.get("samples"), dict):
            f = f.f_back
        if f is not None and isinstance(f.f_locals.get("start"), torch.cuda.Event):
            f.f_locals["start"].record()
        return super().forward(x)
