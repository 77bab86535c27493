"""A linear layer (a GEMM with a bias), the shape of KernelBench's GEMM problems scaled down: where a Triton
candidate's tl.dot, left at its default input_precision, reads the fp32 operands as TF32."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return self.linear(x)


batch_size = 256
in_features = 2048
out_features = 512


def get_inputs():
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
