"""The candidates' model: the RMSNorm of an installed training library (liger_kernel's Triton kernels), called with the
reference's weight and epsilon. The kernels that run are the library's, not the candidate's."""
import torch
import torch.nn as nn
from liger_kernel.ops.rms_norm import LigerRMSNormFunction


class LigerRMSNorm(nn.Module):
    def __init__(self, hidden, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x):
        return LigerRMSNormFunction.apply(x.contiguous(), self.weight, self.eps, 0.0, "llama", False)
