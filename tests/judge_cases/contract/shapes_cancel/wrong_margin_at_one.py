"""The margin 1% off at a batch of one only: right at the benchmark's shape, wrong at the member, beyond the
roundings the member's budget allows. Accepted without --shapes."""
import torch.nn as nn
import torch.nn.functional as F

EXPECT = r"^shapes: right at 128x4096, 128x4096, 128x4096 only, wrong at 1x4096, 1x4096, 1x4096 \(one sizes\): .*relL2"
KIND = "wrong_output"
DEVICES = ("cuda", "cpu")
FLAGS = ("--allow-torch", "--shapes", "one")


class ModelNew(nn.Module):
    def __init__(self, margin):
        super().__init__()
        self.margin = margin

    def forward(self, anchor, positive, negative):
        margin = self.margin if anchor.shape[0] > 1 else self.margin * 1.01
        return F.triplet_margin_loss(anchor, positive, negative, margin=margin)
