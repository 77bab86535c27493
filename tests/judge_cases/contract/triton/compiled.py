"""torch.compile of the reference's own softmax: Inductor writes and compiles a Triton kernel at the first call, but
its code is torch.compile's, not the candidate's. Rejected without --allow-torch, the kernel labelled
torch.compile's."""
import torch
import torch.nn as nn

EXPECT = r"own kernel: no kernel of the row's own ran \(kernels seen: .*torch.compile's"
KIND = "own_kernel"
DEVICES = ("cuda",)
NEEDS = ("triton",)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = torch.compile(lambda x: torch.softmax(x, dim=1))

    def forward(self, x):
        return self.f(x)
