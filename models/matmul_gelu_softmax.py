"""KernelBench level2/99: Linear(8192 -> 8192) on a 1024 x 8192 batch, exact GELU, row softmax."""

import torch
import torch.nn as nn

from harness import Kernel, LinearGemm, check_input, trained
from peers import triton_gemm

BOUND = "compute"
DEFAULT_VARIANT = ("2_split_wgmma", "1_cublas_fused_epilogue")  # the first of these that runs on this GPU
EXPORTS = ("bias_gelu_softmax",)  # every rung KP_EXPORTs these (split_gemm: optional)
PRECISIONS = ("fp32", "tf32")  # run.py --precision tf32: the opt-in reduced-precision mode
# Extra rows of the run.py table (harness.LinearGemm): rung 1 with cuBLAS SGEMM instead of its DGEMM, in the tf32
# mode rung 2 with its own kernel for the one product, and, where
# Triton is installed, the peer row: Triton's tf32x3 GEMM (tf32 in the tf32 mode) followed by the same epilogue.
ROW_OPTIONS = {
    "gemm=fp32": {"gemm": "fp32", "variants": ("1_cublas_fused_epilogue",)},
    # tf32: the one product on the split kernel instead of cuBLAS's fp16 GEMM (harness.LinearGemm)
    "gemm=split_wgmma": {"gemm": "split_wgmma", "variants": ("2_split_wgmma",), "precisions": ("tf32",)},
}
if triton_gemm.available():
    ROW_OPTIONS["gemm=triton"] = {"gemm": "triton", "variants": ("1_cublas_fused_epilogue",), "peer": True}


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        x = self.linear(x)
        x = torch.nn.functional.gelu(x)
        x = torch.nn.functional.softmax(x, dim=1)
        return x


batch_size = 1024  # the shape family's size (--shapes judges at other batches); the features are the model's
in_features = 8192


# run.py --at test judges here, in place of the benchmark's shape (quick checks, the GPU tests): 128 rows of the
# batch; the features are the model's
TEST_SIZES = {"batch_size": 128}


def get_inputs():
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    return [in_features, 8192]


class ModelNew(nn.Module):
    def __init__(
        self, in_features, out_features, variant: str = "default", gemm: str = "auto", precision: str = "fp32"
    ):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)  # same parameters, same init order, same state_dict
        self.k = Kernel("matmul_gelu_softmax", variant)
        self.gemm = LinearGemm(gemm, self.k, precision)

    def forward(self, x):
        # Trained through PyTorch: the backward recomputes the layer with torch's ops (harness.trained); its
        # gradients are two more GEMMs, which cuBLAS runs (docs/linear_problems.md, "Training").
        return trained(self._kernel, _reference, x, self.linear.weight, self.linear.bias)

    def _kernel(self, x, w, b):
        check_input(x, "x", self.linear.in_features)
        y = self.gemm(x, w)
        self.k.bias_gelu_softmax(y, b if b is not None else y.new_empty(0), y)  # in place
        return y


def _reference(x, w, b):
    return torch.nn.functional.softmax(torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b)), dim=1)


def traffic(x, init=None, **opts):
    """The GEMM's FLOPs (what bounds it); bytes: x, W, b in and the output out once."""
    m, k = x.shape
    n = (init or get_init_inputs())[1]
    return {"flops": 2 * m * k * n, "bytes": x.element_size() * (m * k + k * n + n + m * n)}


def _x(rows, cols, g, d, scale=1.0):
    return (torch.rand(rows, cols, generator=g) * scale).to(d)


def _offset_x(rows, cols, g, d):
    base = torch.rand(rows * cols + 1, generator=g).to(d)
    return base[1:].view(rows, cols)  # storage offset 1: no 16-byte alignment


# Small odd cases: name -> fn(generator, device) -> (init inputs, forward inputs).
CASES = {
    "odd_small": lambda g, d: ([37, 53], [_x(5, 37, g, d)]),
    "batch1": lambda g, d: ([64, 100], [_x(1, 64, g, d)]),
    "features_not_mult4": lambda g, d: ([130, 1031], [_x(17, 130, g, d)]),
    "transposed_x": lambda g, d: ([96, 200], [_x(96, 33, g, d).t()]),
    "offset_x": lambda g, d: ([129, 77], [_offset_x(9, 129, g, d)]),
    "large_values": lambda g, d: ([256, 512], [(torch.randn(8, 256, generator=g) * 40).to(d)]),
    "long_rows": lambda g, d: ([16, 70001], [_x(3, 16, g, d)]),  # longer than shared memory: the recompute path
}
