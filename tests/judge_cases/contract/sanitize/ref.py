"""Row sums of a float32 matrix whose rows are not a multiple of a block's threads: the reference of the candidates
that are right on every call the judge checks and still read out of bounds, read memory nothing wrote, or race on
shared memory (judged with --sanitize, and --no-bench: what they show is the tools' verdict, not a time)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x.sum(dim=1)


def get_inputs():
    return [torch.rand(2048, 4099)]


def get_init_inputs():
    return []
