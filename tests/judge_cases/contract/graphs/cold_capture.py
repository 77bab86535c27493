"""Captures the forward in a CUDA graph at its first call with no warm-up call before the capture, on a side stream
that waits for the caller's: cuBLAS's first use in the process happens inside the capture. Right in any process
where the reference ran first (cuBLAS's handle and workspace already made), as in a user's; the judge's worker must
be such a process, without the `--bench` baselines' help. Accepted, timed or not."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECT = None
DEVICES = ("cuda",)
FLAGS = ("--allow-torch", "--no-bench")


class ModelNew(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.fc = nn.Linear(n_in, n_out)
        self.graph = None

    def forward(self, x):
        if self.graph is None or self.static_x.shape != x.shape:
            self.static_x = x.clone()
            self.graph = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                with torch.cuda.graph(self.graph):
                    self.static_y = torch.relu(F.linear(self.static_x, self.fc.weight, self.fc.bias))
            torch.cuda.current_stream().wait_stream(side)
        self.static_x.copy_(x)
        self.graph.replay()
        return self.static_y.clone()
