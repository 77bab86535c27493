"""Training-mode BatchNorm2d over a (64, 64, 512, 512) tensor (8 GiB of inputs and outputs)."""
import torch
import torch.nn as nn

batch_size = 64
features = 64
dim1 = 512
dim2 = 512


class Model(nn.Module):
    def __init__(self, num_features: int):
        super().__init__()
        self.bn = nn.BatchNorm2d(num_features=num_features)

    def forward(self, x):
        return self.bn(x)


def get_inputs():
    return [torch.randn(batch_size, features, dim1, dim2)]


def get_init_inputs():
    return [features]
