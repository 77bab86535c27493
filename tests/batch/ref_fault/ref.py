"""A reference that faults on the GPU: its targets run past the class count, so cross-entropy's kernel fails a
device-side assert in the judge's own process (the reference runs there), which leaves that process's CUDA context
unusable. On the CPU it raises an IndexError."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, predictions, targets):
        return torch.nn.functional.cross_entropy(predictions, targets)


def get_inputs():
    return [torch.randn(64, 10), torch.randint(10, 20, (64,))]


def get_init_inputs():
    return []
