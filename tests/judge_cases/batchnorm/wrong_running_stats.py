"""BatchNorm written for inference: it always normalises with the running statistics, as the leaderboard's fused
BatchNorm kernels do. Right in eval mode, wrong for a fresh Model, which trains; the reason names the cause."""
import torch.nn as nn
import torch.nn.functional as F

EXPECT = r"trial 1 .*relL2 .*it matches the reference in eval mode: it normalises with BatchNorm's running statistics"
KIND = "wrong_output"
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.bn = nn.BatchNorm1d(features)

    def forward(self, x):
        bn = self.bn
        return F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias, False, 0.0, bn.eps)
