"""The shipped kernels, and a forward that walks up into the worker's timing loop and drops each timed call's output
before the hand-over, so that no timed call is ever offered to the judge for a check (a kernel could then be wrong,
or do less, only while timed). The judge holds the samples it was told of, call by call, and the count differs."""
import sys

from models.matmul_sum_max_mean_lse import ModelNew as _Shipped

PROBLEM = "matmul_sum_max_mean_lse"
EXPECT = r"timing: the \d+ samples of candidate returned at the end differ from the 0 told to the judge"
KIND = "timing"
DEVICES = ("cuda",)


class ModelNew(_Shipped):
    def forward(self, x):
        f = sys._getframe(1)
        while f is not None and not isinstance(f.f_locals.get("tally"), dict):
            f = f.f_back
        if f is not None:
            f.f_locals["tally"]["timed"] = None
        return super().forward(x)
