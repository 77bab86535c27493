"""A softmax's backward as autograd runs it, dx = y * (dy - rowsum(dy * y)), over rows of 1001; the declared case
has nearly one-hot rows (logits x5), where dy - rowsum cancels at the peak: any fp32 kernel's roundings of the sum
are amplified there, PyTorch's own and an honest kernel's alike, by different amounts."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, y, dy):
        return torch._softmax_backward_data(dy, y, 1, y.dtype)


def get_inputs():
    return [torch.softmax(torch.randn(64, 1001), dim=1), torch.randn(64, 1001)]


def get_init_inputs():
    return []


def _peaked(g, device):
    y = torch.softmax(torch.randn(33, 1001, generator=g) * 5.0, dim=1)
    return [], [y.to(device), torch.randn(33, 1001, generator=g).to(device)]


CASES = {"peaked": _peaked}
