"""The forward computed under torch.no_grad() (an inference habit): right values, no grad_fn, nothing can be
trained. Rejected with --backward, with the reason, never a crash; accepted without it."""
import torch
import torch.nn as nn

EXPECT = r"no grad_fn"
KIND = "raised"
DEVICES = ("cpu", "cuda")
FLAGS = ("--allow-torch", "--backward")


class ModelNew(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.fc = nn.Linear(n_in, n_out)

    def forward(self, x):
        with torch.no_grad():
            return torch.tanh(self.fc(x))
