"""x @ W.sum(0) + b.sum() with the playground's GEMV kernel and the column sum in float64, but the column sum is
taken once, at the first call, and never again: right until the weights change (an optimizer step,
load_state_dict, an in-place edit), then it answers for the old weights. The judge changes the weights between
parity calls and before the timed calls."""
import torch
import torch.nn as nn

from harness import Kernel

PROBLEM = "matmul_sum_max_mean_lse"
EXPECT = r"after an optimizer step.*stale weight cache"
KIND = "wrong_output"
DEVICES = ("cuda",)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.k = Kernel("matmul_sum_max_mean_lse", "4_overlap")
        self.sums = None

    def forward(self, x):
        if self.sums is None:
            w, b = self.linear.weight, self.linear.bias
            self.sums = (w.double().sum(0), b.double().sum().reshape(1))
        out = torch.empty(x.size(0), 1, device=x.device)
        self.k.gemv_bias(x.contiguous(), *self.sums, out)
        return out
