"""Captures torch.matmul(a, b, out=buf) in a CUDA graph on its first call's input tensors and replays it at every
later call, whatever tensors that call was given. In a plain process it looks right while the caching allocator
hands each call's inputs the first call's addresses. Rejected at parity, before any fault, naming the cause: at a
call whose inputs live at new addresses its output is the previous call's product."""
import torch
import torch.nn as nn

EXPECT = r"trial 3 .*follows an earlier call's inputs .*right with its values at the previous call's addresses"
KIND = "stale_inputs"
DEVICES = ("cuda",)
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.graph = None

    def forward(self, a, b):
        if self.graph is None:
            self.out = torch.empty(a.shape[0], b.shape[1], device=a.device)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                torch.matmul(a, b, out=self.out)  # warm-up outside the graph: cuBLAS's handle and workspace
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                torch.matmul(a, b, out=self.out)
        self.graph.replay()
        return self.out.clone()
