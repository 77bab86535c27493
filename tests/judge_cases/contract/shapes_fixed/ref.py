"""A convolution whose first layer fixes its input channels (3) while the channel count is a module-level size that
get_inputs() alone reads, as KernelBench's image networks have it, pooled per image, then a BatchNorm over the batch
added to its input: the family's members that move the channels are shapes the reference itself does not take (the
size is held), and in training mode a batch of one neither (a BatchNorm of one value per channel)."""
import torch
import torch.nn as nn

batch_size = 6
in_channels = 3
height = 12
width = 12


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x):
        y = self.pool(self.conv(x)).flatten(1)
        return self.bn(y) + y


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return []
