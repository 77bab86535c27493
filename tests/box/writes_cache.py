"""Truncates every cached kernel library of the playground and leaves a marker in the cache (a candidate could as
well leave a working but wrong library there for the playground to load later)."""
import os
import pwd
from pathlib import Path

import torch
import torch.nn as nn

EXPECT = r"Read-only file system|Permission denied"


def cache() -> Path:
    """The judge's kernel cache: named to the box as KP_CACHE_SHARED, else where the judge keeps it."""
    home = pwd.getpwuid(os.getuid()).pw_dir  # the real home: the box's HOME is not it
    return Path(os.environ.get("KP_CACHE_SHARED") or os.environ.get("KP_CACHE_DIR")
                or Path(home) / ".cache" / "kernel_playground")


class ModelNew(nn.Module):
    def forward(self, x):
        for so in cache().rglob("*.so"):
            with open(so, "r+b") as f:
                f.truncate(0)
        (cache() / "left_by_a_candidate").write_text("marker")
        return torch.relu(x)
