"""matmul_gelu_softmax that turns TF32 on and leaves it on (as some 'speedups' do globally)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

PROBLEM = "matmul_gelu_softmax"
EXPECT = r"switched TF32 on in fp32 mode"
KIND = "tampering"
DEVICES = ("cuda", "cpu")


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        torch.backends.cuda.matmul.allow_tf32 = True
        return torch.softmax(F.gelu(self.linear(x)), dim=1)
