"""Cross-entropy loss of a 32768 x 4096 batch of logits (512 MiB of inputs) against integer targets."""
import torch
import torch.nn as nn

batch_size = 32768
num_classes = 4096


class Model(nn.Module):
    def forward(self, predictions, targets):
        return torch.nn.functional.cross_entropy(predictions, targets)


def get_inputs():
    return [torch.randn(batch_size, num_classes), torch.randint(0, num_classes, (batch_size,))]


def get_init_inputs():
    return []
