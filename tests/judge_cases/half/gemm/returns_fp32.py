"""Returns fp32 from a bf16 problem (the product never rounded to the problem's dtype): the output is not what the
reference returns, twice its bytes."""
import torch
import torch.nn as nn

EXPECT = (r"^trial 1 \(seed \d+\): output is Tensor \(128, 128\) torch.float32 \S+, "
          r"expected torch.Tensor \(128, 128\) torch.bfloat16")
KIND = "wrong_shape"
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch", "--precision", "bf16")


class ModelNew(nn.Module):
    def forward(self, a, b):
        return a.float() @ b.float()
