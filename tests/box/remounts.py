"""Remounts the kernel cache writable inside its box and leaves a marker there: a process that kept root's
capabilities in the box could undo every read-only bind this way."""
import ctypes
import os
import pwd
from pathlib import Path

import torch
import torch.nn as nn

EXPECT = r"Operation not permitted"
MS_BIND, MS_REMOUNT = 4096, 32


def cache() -> Path:
    """The judge's kernel cache: named to the box as KP_CACHE_SHARED, else where the judge keeps it."""
    home = pwd.getpwuid(os.getuid()).pw_dir  # the real home: the box's HOME is not it
    return Path(os.environ.get("KP_CACHE_SHARED") or os.environ.get("KP_CACHE_DIR")
                or Path(home) / ".cache" / "kernel_playground")


class ModelNew(nn.Module):
    def forward(self, x):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.mount(None, str(cache()).encode(), None, MS_REMOUNT | MS_BIND, None):
            e = ctypes.get_errno()
            raise OSError(e, f"remounting {cache()} writable: {os.strerror(e)}")
        (cache() / "left_by_a_candidate").write_text("marker")
        return torch.relu(x)
