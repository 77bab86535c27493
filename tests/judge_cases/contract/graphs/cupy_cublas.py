"""The matrix product through CuPy's cuBLAS binding (cupy.matmul) on PyTorch's current stream, the bias and ReLU in
PyTorch. Accepted: cuBLAS is a library a candidate may call from any binding."""
import cupy
import torch
import torch.nn as nn

EXPECT = None
DEVICES = ("cuda",)
FLAGS = ("--allow-torch",)
NEEDS = ("cupy",)


class ModelNew(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.fc = nn.Linear(n_in, n_out)

    def forward(self, x):
        x = x.contiguous()
        w = self.fc.weight.detach().contiguous()
        y = torch.empty(x.shape[0], w.shape[0], device=x.device)
        with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            cupy.matmul(cupy.asarray(x), cupy.asarray(w).T, out=cupy.asarray(y))
        return torch.relu(y + self.fc.bias)
