"""The same captured graph, replayed on a side stream of its own that never waits for the caller's stream and is
never joined: the output is cloned on the caller's stream while the replay may still run (and later work escapes
the timer). Rejected."""
import torch
import torch.nn as nn

EXPECT = r"escape|relL2|NaN/Inf"
KIND = "escape"
DEVICES = ("cuda",)
FLAGS = ("--allow-torch",)


class ModelNew(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.fc = nn.Linear(n_in, n_out)
        self.graph = None
        self.side = None

    def _run(self):
        self.static_y = torch.relu(self.fc(self.static_x))

    def forward(self, x):
        if self.graph is None or self.static_x.shape != x.shape:
            self.side = torch.cuda.Stream()
            self.static_x = x.clone()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                self._run()
            torch.cuda.current_stream().wait_stream(s)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self._run()
        self.static_x.copy_(x)
        with torch.cuda.stream(self.side):
            torch.cuda._sleep(2_000_000)  # the side stream's replay starts late
            self.graph.replay()
        return self.static_y
