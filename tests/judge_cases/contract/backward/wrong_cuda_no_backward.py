"""The linear layer in PyTorch, the tanh by a kernel of its own (tanh.cu, load_inline) with no autograd formula:
its output has no grad_fn, so the layer cannot be trained. Rejected with --backward naming that, never a crash;
accepted without it (its forward is right, and its own kernel runs)."""
from pathlib import Path

import torch.nn as nn
from torch.utils.cpp_extension import load_inline

EXPECT = r"no grad_fn"
KIND = "raised"
DEVICES = ("cuda",)
FLAGS = ("--backward",)

_ext = load_inline(name="judge_case_backward_tanh", cpp_sources="at::Tensor tanh_forward(at::Tensor x);",
                   cuda_sources=(Path(__file__).parent / "tanh.cu").read_text(), functions=["tanh_forward"],
                   extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.fc = nn.Linear(n_in, n_out)

    def forward(self, x):
        return _ext.tanh_forward(self.fc(x))
