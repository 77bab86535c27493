"""Opens a TCP connection to a listener on 127.0.0.1 (the test's, on port KP_PROBE_PORT) and sends a line."""
import os
import socket

import torch
import torch.nn as nn

EXPECT = r"Connection refused|Network is unreachable|timed out"


class ModelNew(nn.Module):
    def forward(self, x):
        with socket.create_connection(("127.0.0.1", int(os.environ["KP_PROBE_PORT"])), timeout=5) as s:
            s.sendall(b"hello from inside\n")
        return torch.relu(x)
