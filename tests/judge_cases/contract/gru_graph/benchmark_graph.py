"""cuDNN's autotuner on; three plain calls, then the GRU captured in a CUDA graph on a side stream that waits for the
caller's, x and h0 copied into the graph's static buffers before each replay on the caller's stream, a clone of the
static output returned. Right on every call (the escape check profiles a replay too). Accepted."""
import torch
import torch.nn as nn

EXPECT = None
DEVICES = ("cuda",)
FLAGS = ("--allow-torch",)

batch_size = 10


class ModelNew(nn.Module):
    def __init__(self, input_size, hidden_size, num_layers):
        super().__init__()
        torch.backends.cudnn.benchmark = True
        self.gru = nn.GRU(input_size, hidden_size, num_layers, batch_first=False)
        self.h0 = torch.randn((num_layers, batch_size, hidden_size))
        self.calls = 0
        self.graph = None

    def forward(self, x):
        self.h0 = self.h0.to(x.device)
        self.calls += 1
        if self.calls <= 3:
            return self.gru(x, self.h0)[0]
        if self.graph is None or self.static_x.shape != x.shape:
            self.static_x, self.static_h0 = x.clone(), self.h0.clone()
            self.graph = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), torch.cuda.graph(self.graph):
                self.static_y = self.gru(self.static_x, self.static_h0)[0]
            torch.cuda.current_stream().wait_stream(side)
        self.static_x.copy_(x)
        self.static_h0.copy_(self.h0)
        self.graph.replay()
        return self.static_y.clone()
