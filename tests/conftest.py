import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HAS_GPU = torch.cuda.is_available()


def gpu(test):
    """Needs a CUDA GPU. Every such test is in one xdist group, so under `-n` they run one at a time in one worker:
    the device is shared (two judges of the 12 GiB softmax problem do not fit an 80 GB card together), while the
    CPU tests spread over the other workers."""
    return pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")(pytest.mark.xdist_group("gpu")(test))
