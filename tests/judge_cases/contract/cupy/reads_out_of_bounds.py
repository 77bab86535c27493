"""A CuPy RawKernel whose grid reads past the end of its input (a row index not bounded by the row count), then a
PyTorch product: the illegal address in its own kernel makes CUDA's context unusable, and the next library call
(cuBLAS's) fails with an error of its own. Rejected: the reason names the fault in the candidate's GPU work, not the
library call where it surfaced."""
import cupy
import torch
import torch.nn as nn

EXPECT = r"(illegal (memory access|address)|fault)"
KIND = "crash"
DEVICES = ("cuda",)
FLAGS = ("--allow-torch",)
NEEDS = ("cupy",)

_SRC = r"""
extern "C" __global__ void scaled_relu_rows(const float* x, float* y, long long cols) {
    long long row = (long long)blockIdx.x * 4096 * 4096;   // rows far past the end of x
    for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = x[row * cols + c];
        y[blockIdx.x * cols + c] = v > 0.f ? 2.0f * v : 0.f;
    }
}
"""
_kernel = cupy.RawKernel(_SRC, "scaled_relu_rows")


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.w = nn.Parameter(torch.randn(n, n) / n ** 0.5)

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            _kernel((x.shape[0],), (256,), (x.data_ptr(), y.data_ptr(), cupy.int64(x.shape[1])))
        return torch.relu(y @ self.w) * 2.0 / 2.0
