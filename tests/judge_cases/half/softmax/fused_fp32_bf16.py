"""A fused bf16 softmax: max, exponentials and sum in fp32, the output rounded to bf16 once."""
import torch
import torch.nn as nn

EXPECT = None
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch", "--precision", "bf16")


class ModelNew(nn.Module):
    def forward(self, x):
        y = x.float()
        e = torch.exp(y - y.amax(dim=1, keepdim=True))
        return (e / e.sum(dim=1, keepdim=True)).to(x.dtype)
