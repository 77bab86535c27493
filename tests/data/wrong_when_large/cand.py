"""Right on small inputs, wrong on large ones: zeroes the last 1,024 columns once the input has more than 2^23
elements (a kernel whose tail handling breaks past some size)."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.nn.functional.leaky_relu(x, 0.01)
        if x.numel() > 2**23:
            y[:, -1024:] = 0
        return y
