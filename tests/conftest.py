import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HAS_GPU = torch.cuda.is_available()


def gpu(test):
    """Needs a CUDA GPU. Every such test is in one xdist group, so under `-n` they run one at a time in one worker:
    the device is shared (two judges of the 12 GiB softmax problem do not fit an 80 GB card together), while the
    CPU tests spread over the other workers."""
    return pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")(pytest.mark.xdist_group("gpu")(test))


def run_script(*args, env=None, timeout=1200):
    """`python run.py ARGS` in a process of its own (the GPU tests: each judge gets a fresh device)."""
    import os
    return subprocess.run([sys.executable, str(ROOT / "run.py"), *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=None if env is None else {**os.environ, **env})


@pytest.fixture
def cli(capsys):
    """run.py's command line in this process (what `python run.py ARGS` does, without a fresh interpreter and torch
    import per call): returns returncode, stdout, stderr. Candidates are still judged in processes of their own."""
    import run

    def call(*args):
        capsys.readouterr()
        try:
            code = run.cli([str(a) for a in args])
        except SystemExit as e:  # argparse's own usage errors
            code = e.code
        out, err = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out, stderr=err)
    return call
