"""matmul_gelu_softmax with TF32 switched on for its GEMM only and switched back off afterwards, so no global flag
is left changed: only the error (TF32 rounds the inputs to 10 mantissa bits) shows it."""
import torch
import torch.nn as nn
import torch.nn.functional as F

PROBLEM = "matmul_gelu_softmax"
EXPECT = r"over budget"
KIND = "wrong_output"
DEVICES = ("cuda",)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            y = self.linear(x)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = False
        return torch.softmax(F.gelu(y), dim=1)
