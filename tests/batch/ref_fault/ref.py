"""A reference that faults on the GPU at a member of its shape family: the predictions' width is a size the family
moves (num_classes), the targets' range is written in (10). At the benchmark's shape it is right; at 9 classes (the
odd member) cross-entropy's kernel fails a device-side assert in the judge's own process, where the reference runs,
which leaves that process's CUDA context unusable. On the CPU it raises an IndexError there."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, predictions, targets):
        return torch.nn.functional.cross_entropy(predictions, targets)


batch_size = 64
num_classes = 10


def get_inputs():
    return [torch.randn(batch_size, num_classes), torch.randint(0, 10, (batch_size,))]


def get_init_inputs():
    return []
