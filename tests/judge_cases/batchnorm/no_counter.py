"""A rewrite that keeps running_mean / running_var as its own buffers and no num_batches_tracked: with momentum set,
PyTorch never reads the counter, so the outputs and the state that matters are the reference's."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = None
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(features))
        self.bias = nn.Parameter(torch.zeros(features))
        self.register_buffer("running_mean", torch.zeros(features))
        self.register_buffer("running_var", torch.ones(features))

    def forward(self, x):
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, self.training, 0.1, 1e-5)
