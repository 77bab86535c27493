"""Wrong: the identity."""
import torch.nn as nn

EXPECT = r"^rejected: trial 1"


class ModelNew(nn.Module):
    def forward(self, x):
        return x.clone()
