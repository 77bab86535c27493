"""Batch statistics only, no running statistics kept: the output of each training-mode call is right, but the
state the reference carries between calls (running_mean / running_var) is gone."""
import torch.nn as nn
import torch.nn.functional as F

EXPECT = r"has no buffer 'bn\.running_mean', which the reference carries between its training-mode calls"
KIND = "wrong_state"
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.bn = nn.BatchNorm1d(features, track_running_stats=False)

    def forward(self, x):
        return self.bn(x)
