"""exp(x) / sum(exp(x)) without subtracting the row maximum: right on torch.rand's [0, 1), NaN where exp overflows
float32 (x > 88.7). The judge's derived inputs (x100) reach that on the benchmark shape; on the CPU, where only the
declared cases run, the special-values case does."""
import torch
import torch.nn as nn

PROBLEM = "softmax"
EXPECT = r"(inputs scaled x100|case special_values).*(NaN/Inf positions differ|over budget)"
KIND = "non_finite"
DEVICES = ("cuda", "cpu")


class ModelNew(nn.Module):
    def forward(self, x):
        e = torch.exp(x)
        return e / e.sum(1, keepdim=True)
