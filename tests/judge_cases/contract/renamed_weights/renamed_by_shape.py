"""The module ported by hand: the conv's weight kept as `weight`, its bias as `conv_bias`, the model's own `bias`
registered after them. Neither the names nor the order line up with the reference's state_dict (bias, conv.weight,
conv.bias); the shapes do, one for one, so the reference's weights are loaded by shape (`bias` by name) and it is
accepted. Mapped by name alone, two of its three parameters kept their own initialisation (its bias is drawn first) and
it was rejected at relL2 0.25."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = None
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super().__init__()
        bias = torch.randn(bias_shape)  # drawn first: its own same-seed values differ from the reference's
        conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.weight = nn.Parameter(conv.weight.detach().clone())
        self.conv_bias = nn.Parameter(conv.bias.detach().clone())
        self.bias = nn.Parameter(bias)

    def forward(self, x):
        return torch.relu(F.conv2d(x, self.weight, self.conv_bias) + self.bias)
