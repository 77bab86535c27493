"""Reads its file's own module-level sizes in forward, as machine-written candidates copied from the reference do:
at the smaller shape the judge checks on the CPU, the same sizes of the candidate's file shrink with the
reference's, so it meets the shapes it is given. Accepted."""
import torch
import torch.nn as nn

EXPECT = None
DEVICES = ("cpu",)
FLAGS = ("--allow-torch",)

batch_size = 4096
dim = 393216


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.nn.functional.gelu(x.view(batch_size, dim))
