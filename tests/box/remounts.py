"""Remounts the kernel cache writable inside its box and leaves a marker there: a process that kept root's
capabilities in the box could undo every read-only bind this way."""
import ctypes
import os

import torch
import torch.nn as nn

from tests.box.writes_cache import cache

EXPECT = r"Operation not permitted"
MS_BIND, MS_REMOUNT = 4096, 32


class ModelNew(nn.Module):
    def forward(self, x):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.mount(None, str(cache()).encode(), None, MS_REMOUNT | MS_BIND, None):
            e = ctypes.get_errno()
            raise OSError(e, f"remounting {cache()} writable: {os.strerror(e)}")
        (cache() / "left_by_a_candidate").write_text("marker")
        return torch.relu(x)
