"""The GEMM through PyTorch, the scaled ReLU through CuPy's own library operations (cupy.maximum, a multiply) on
PyTorch's memory: right, but the kernels that run are CuPy's, not the candidate's. Rejected without --allow-torch
(accepted with it, as any rewrite over a library is)."""
import cupy
import torch
import torch.nn as nn

EXPECT = r"own kernel: no kernel of the row's own ran"
KIND = "own_kernel"
DEVICES = ("cuda",)
NEEDS = ("cupy",)


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.w = nn.Parameter(torch.randn(n, n) / n ** 0.5)

    def forward(self, x):
        h = (x @ self.w).contiguous()
        with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            y = cupy.maximum(cupy.from_dlpack(h), 0) * 2.0
        return torch.from_dlpack(y)
