"""Returns zeros. Softmax outputs are ~2.5e-6 at the benchmark shape, so allclose(atol=1e-4) would pass this."""
import torch
import torch.nn as nn

PROBLEM = "softmax"
EXPECT = r"relL2 1\.00e\+00 .*over budget"
KIND = "wrong_output"
DEVICES = ("cuda", "cpu")


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.zeros_like(x)
