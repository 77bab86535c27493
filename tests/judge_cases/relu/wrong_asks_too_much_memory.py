"""Asks the GPU for more memory than it has: a rejection that says the request was the candidate's own (more than
the GPU had free when the judge started), not a no-verdict blamed on other processes."""
import torch
import torch.nn as nn

EXPECT = r"raised OutOfMemoryError.*more than the [0-9.]+ GiB the GPU had free when the judge started"
KIND = "out_of_memory"
DEVICES = ("cuda",)
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def forward(self, x):
        scratch = torch.empty(torch.cuda.mem_get_info()[1] + 2**30, dtype=torch.uint8, device=x.device)
        return torch.relu(x) + scratch[:1].float() * 0
