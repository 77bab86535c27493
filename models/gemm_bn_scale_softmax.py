"""KernelBench level2/84: Linear, BatchNorm1d (training mode by default), scale, row softmax."""

import torch
import torch.nn as nn

from harness import Kernel, LinearGemm, check_input, trained
from peers import triton_gemm

BOUND = "compute"
DEFAULT_VARIANT = ("2_split_wgmma", "1_cublas_fused_epilogue")  # the first of these that runs on this GPU
EXPORTS = ("bn_coefficients", "bn_scale_softmax")  # every rung KP_EXPORTs these (split_gemm: optional)
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
    def __init__(self, in_features, out_features, bn_eps=1e-5, bn_momentum=0.1, scale_shape=(1,)):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.bn = nn.BatchNorm1d(out_features, eps=bn_eps, momentum=bn_momentum)
        self.scale = nn.Parameter(torch.ones(scale_shape))
        self.softmax = nn.Softmax(dim=1)

    def forward(self, x):
        x = self.gemm(x)
        x = self.bn(x)
        x = self.scale * x
        x = self.softmax(x)
        return x


batch_size = 1024  # the shape family's size (--shapes judges at other batches); the features are the model's
in_features = 8192


# run.py --at test judges here, in place of the benchmark's shape (quick checks, the GPU tests): 128 rows of the
# batch; the features are the model's
TEST_SIZES = {"batch_size": 128}


def get_inputs():
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    return [in_features, 8192, 1e-5, 0.1, (1,)]


class ModelNew(nn.Module):
    def __init__(
        self,
        in_features,
        out_features,
        bn_eps=1e-5,
        bn_momentum=0.1,
        scale_shape=(1,),
        variant: str = "default",
        gemm: str = "auto",
        precision: str = "fp32",
    ):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)  # same modules, same init order, same state_dict keys
        self.bn = nn.BatchNorm1d(out_features, eps=bn_eps, momentum=bn_momentum)
        self.scale = nn.Parameter(torch.ones(scale_shape))
        self.k = Kernel("gemm_bn_scale_softmax", variant)
        self.gemm_fn = LinearGemm(gemm, self.k, precision)

    def forward(self, x):
        # Trained through PyTorch: the backward recomputes the layer with torch's ops (harness.trained), BatchNorm on
        # the batch's statistics in training mode (its running statistics are not moved again), on its running ones
        # in eval mode; the GEMM's gradients are two more GEMMs, which cuBLAS runs.
        bn = self.bn
        stats = (None, None) if bn.training or bn.running_mean is None else (bn.running_mean, bn.running_var)
        ref = lambda x, w, b, g, h, s: torch.softmax(
            s
            * torch.nn.functional.batch_norm(
                torch.nn.functional.linear(x, w, b), *stats, g, h, stats[0] is None, 0.0, bn.eps
            ),
            dim=1,
        )
        return trained(
            lambda x, *_: self._kernel(x), ref, x, self.gemm.weight, self.gemm.bias, bn.weight, bn.bias, self.scale
        )

    def _kernel(self, x):
        check_input(x, "x", self.gemm.in_features)
        bn, n = self.bn, self.gemm.out_features
        if self.scale.numel() not in (1, n) or any(d != 1 for d in self.scale.shape[:-1]):
            raise ValueError(f"scale of shape {tuple(self.scale.shape)} does not broadcast per column of {n}")
        training = bn.training or bn.running_mean is None
        if training and x.size(0) < 2:  # nn.BatchNorm1d's own rule and message
            raise ValueError(f"Expected more than 1 value per channel when training, got input size {tuple(x.shape)}")
        y = self.gemm_fn(x, self.gemm.weight)  # the Linear bias is folded into the statistics (see the .cu)
        if training:
            bn.num_batches_tracked.add_(1)
        mean, a, c = torch.empty(3, n, device=y.device)
        empty = y.new_empty(0)
        opt = lambda t: empty if t is None else t.reshape(-1)
        self.k.bn_coefficients(
            y,
            training,
            bn.running_mean,
            bn.running_var,
            bn.num_batches_tracked,
            bn.momentum or 0.0,
            bn.momentum is None,
            opt(bn.weight),
            opt(bn.bias),
            self.scale.reshape(-1),
            bn.eps,
            opt(self.gemm.bias),
            mean,
            a,
            c,
        )
        self.k.bn_scale_softmax(y, mean, a, c, y)  # in place
        return y


def traffic(x, init=None, **opts):
    """The GEMM's FLOPs (what bounds it); bytes: x, W, the BN/scale vectors in and the output out once."""
    m, k = x.shape
    n = (init or get_init_inputs())[1]
    return {"flops": 2 * m * k * n, "bytes": x.element_size() * (m * k + k * n + 4 * n + m * n)}


def _x(rows, cols, g, d, scale=1.0):
    return (torch.rand(rows, cols, generator=g) * scale).to(d)


def _offset_x(rows, cols, g, d):
    base = torch.rand(rows * cols + 1, generator=g).to(d)
    return base[1:].view(rows, cols)


CASES = {
    "odd_small": lambda g, d: ([37, 53], [_x(5, 37, g, d)]),
    "batch2": lambda g, d: ([64, 100], [_x(2, 64, g, d)]),
    "features_not_mult4": lambda g, d: ([130, 1031], [_x(17, 130, g, d)]),
    "transposed_x": lambda g, d: ([96, 200], [_x(96, 33, g, d).t()]),
    "offset_x": lambda g, d: ([129, 77], [_offset_x(9, 129, g, d)]),
    "momentum_none": lambda g, d: ([48, 40, 1e-3, None, (1,)], [_x(7, 48, g, d)]),
    "scale_per_column": lambda g, d: ([48, 40, 1e-5, 0.1, (40,)], [_x(7, 48, g, d)]),
    "long_rows": lambda g, d: ([16, 70001], [_x(3, 16, g, d)]),
}
