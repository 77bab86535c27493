"""The same graph, captured on static buffers of its own, each call's inputs copied into them before the replay.
Accepted: the inputs' new addresses change nothing."""
import torch
import torch.nn as nn

EXPECT = None
DEVICES = ("cuda",)
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.graph = None

    def forward(self, a, b):
        if self.graph is None or self.a.shape != a.shape or self.b.shape != b.shape:
            self.a, self.b = a.clone(), b.clone()
            self.out = torch.empty(a.shape[0], b.shape[1], device=a.device)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                torch.matmul(self.a, self.b, out=self.out)
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                torch.matmul(self.a, self.b, out=self.out)
        self.a.copy_(a)
        self.b.copy_(b)
        self.graph.replay()
        return self.out.clone()
