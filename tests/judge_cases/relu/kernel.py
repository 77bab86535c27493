"""ReLU with its own kernel, built by torch.utils.cpp_extension.load_inline from relu.cu beside this file."""
from pathlib import Path

import torch.nn as nn
from torch.utils.cpp_extension import load_inline

EXPECT = None
DEVICES = ("cuda",)
FLAGS = ()

_ext = load_inline(name="judge_case_relu", cpp_sources="at::Tensor relu_forward(at::Tensor x);",
                   cuda_sources=(Path(__file__).parent / "relu.cu").read_text(), functions=["relu_forward"],
                   extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def forward(self, x):
        return _ext.relu_forward(x.contiguous())
