"""Each distance's sum of squares added up in order in fp32 (as one thread per sample does it in a plain kernel):
right. At a batch of one the loss is the difference of two distances near 90, so its rounding is far larger
relative to the loss than the floor for a 4096-term sum says; the mean over 128 samples hides that at the
benchmark's shape. Accepted under --shapes: a member's output of a few elements gets a budget no smaller than how far
the reference moves under such roundings (kp.lib.op_modes.RoundingNoise)."""
import numpy as np
import torch
import torch.nn as nn

EXPECT = None
DEVICES = ("cpu",)  # computed on the host: on a GPU its work would escape the timed stream
FLAGS = ("--allow-torch", "--shapes", "one")


def _distance(x, y):
    d = (x - y + np.float32(1e-6)).astype(np.float32)
    return np.sqrt(np.add.accumulate(d * d, axis=1, dtype=np.float32)[:, -1])


class ModelNew(nn.Module):
    def __init__(self, margin):
        super().__init__()
        self.margin = np.float32(margin)

    def forward(self, anchor, positive, negative):
        a, p, n = (t.detach().cpu().numpy() for t in (anchor, positive, negative))
        loss = np.maximum(_distance(a, p) - _distance(a, n) + self.margin, np.float32(0))
        return torch.tensor(loss.mean(dtype=np.float32), dtype=anchor.dtype, device=anchor.device)
