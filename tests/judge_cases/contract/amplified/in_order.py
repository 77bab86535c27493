"""The product summed in order in fp32, one term at a time, then torch's softmax: accepted, at the inputs x100 too,
where its error is over its budget but within how far honest fp32 roundings move the reference."""
import torch
import torch.nn as nn

EXPECT = None
DEVICES = ("cuda", "cpu")
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.clusters = nn.Parameter(torch.randn(512, 32) / 512 ** 0.5)

    def forward(self, x):
        acc = torch.zeros(x.shape[0], self.clusters.shape[1], dtype=x.dtype, device=x.device)
        for k in range(x.shape[1]):
            acc = acc + x[:, k:k + 1] * self.clusters[k]
        return torch.softmax(acc, dim=-1)
