"""The shipped kernels, and a forward that walks up its callers' frames into the timer's and halves the samples
already taken of itself: right outputs, a median half the truth, and a smaller sum that a wall-clock bound alone
would not see. Each sample reached the judge right after its call, before the candidate ran again, so the samples
the timer returns at the end differ from those it told."""
import sys

from models.matmul_sum_max_mean_lse import ModelNew as _Shipped

PROBLEM = "matmul_sum_max_mean_lse"
EXPECT = r"timing: the \d+ samples of candidate returned at the end differ from the \d+ told to the judge"
KIND = "timing"
DEVICES = ("cuda",)


class ModelNew(_Shipped):
    def forward(self, x):
        f = sys._getframe(1)
        while f is not None and not isinstance(f.f_locals.get("samples"), dict):
            f = f.f_back
        if f is not None:
            mine = f.f_locals["samples"].get("candidate")
            if mine:
                mine[:] = [v / 2 for v in mine]
        return super().forward(x)
