"""A softmax over rows of 1001, judged with --backward: its gradient dx = y * (dy - rowsum(dy * y)). The declared
case has nearly one-hot rows (logits x5), where the gradient cancels at each row's peak and any fp32 kernel's
roundings of the row sum are amplified, PyTorch's own and an honest kernel's alike, by different amounts."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.randn(64, 1001)]


def get_init_inputs():
    return []


CASES = {"peaked": lambda g, d: ([], [(torch.randn(33, 1001, generator=g) * 5.0).to(d)])}
