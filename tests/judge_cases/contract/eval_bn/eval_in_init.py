"""Calls self.eval() in its own __init__: BatchNorm then uses running statistics, wrong where the reference trains.
Rejected at construction with that reason, before any numbers."""
import torch.nn as nn

EXPECT = (r"construct: ModelNew is in eval mode \(self.training is False\) but the reference trains: "
          r"BatchNorm would use running statistics")
KIND = "construct"
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3)
        self.bn = nn.BatchNorm2d(cout)
        self.eval()

    def forward(self, x):
        return self.bn(self.conv(x))
