"""A matmul on streams of its own with a cached output buffer, as machine-written candidates do: work forked onto
two side streams that wait for the caller's stream, joined back before returning; the output buffer allocated once
and reused. The judge gets a copy of each output before the next call, so reuse is fine. Accepted."""
import torch
import torch.nn as nn

EXPECT = None
DEVICES = ("cuda",)
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.fc = nn.Linear(n_in, n_out)
        self.streams = None
        self.out = None

    def forward(self, x):
        if self.streams is None:
            self.streams = (torch.cuda.Stream(), torch.cuda.Stream())
        rows = x.shape[0]
        if self.out is None or self.out.shape != (rows, self.fc.out_features) or self.out.device != x.device:
            self.out = torch.empty(rows, self.fc.out_features, device=x.device)
        caller = torch.cuda.current_stream()
        half = rows // 2
        for s, sl in zip(self.streams, (slice(0, half), slice(half, rows))):
            s.wait_stream(caller)
            with torch.cuda.stream(s):
                torch.addmm(self.fc.bias, x[sl], self.fc.weight.t(), out=self.out[sl])
                self.out[sl].relu_()
        for s in self.streams:
            caller.wait_stream(s)
        return self.out
