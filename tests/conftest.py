import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest


def host_gpus() -> list[str]:
    """The GPUs this run may use, found without starting CUDA (which reads CUDA_VISIBLE_DEVICES once, at its
    start): CUDA_VISIBLE_DEVICES's list where it is set, else one per GPU nvidia-smi lists; [] without either."""
    seen = os.environ.get("CUDA_VISIBLE_DEVICES")
    if seen is not None:
        return [d.strip() for d in seen.split(",") if d.strip()]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, ln in enumerate(ln for ln in out.splitlines() if ln.startswith("GPU "))]


def worker_gpu(worker: str | None, gpus: list[str]) -> str | None:
    """The GPU an xdist worker ("gw3") is pinned to where the host has several: worker k takes GPU k mod their
    number, so `-n <GPUs>` gives each GPU one worker."""
    if not worker or not worker.startswith("gw") or len(gpus) < 2:
        return None
    return gpus[int(worker[2:]) % len(gpus)]


GPUS = host_gpus()
_PIN = worker_gpu(os.environ.get("PYTEST_XDIST_WORKER"), GPUS)
if _PIN is not None:  # before torch starts CUDA in this process
    os.environ["CUDA_VISIBLE_DEVICES"] = _PIN

import torch  # noqa: E402 (after the worker's GPU is chosen)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HAS_GPU = torch.cuda.is_available()


def gpu(test):
    """Needs a CUDA GPU. Every such test is in one xdist group, so under `-n` they run one at a time in one worker:
    the device is shared (two judges of the 12 GiB softmax problem do not fit an 80 GB card together), while the
    CPU tests spread over the other workers. On a host of several GPUs the group is split, one per GPU
    (pytest_collection_modifyitems), and each worker is pinned to a GPU of its own: `-n <GPUs>` runs them all."""
    return pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")(pytest.mark.xdist_group("gpu")(test))


def gpu_groups(names: list[str], n_gpus: int) -> dict[str, str]:
    """The GPU tests (by node id, in collection order) dealt round-robin into one xdist group per GPU, so each
    group's heavy tests (the 36 GiB softmax cases sit together in the order) are shared out; every worker computes
    the same deal from the same collection."""
    return {name: f"gpu{i % n_gpus}" for i, name in enumerate(names)} if n_gpus > 1 else {}


@pytest.fixture(autouse=True)
def _one_test_per_gpu(request):
    """A GPU test holds its pinned GPU's lock for its run: where more workers than GPUs are started (`-n auto`),
    two workers pinned to one GPU take turns there, as the one-group rule intends."""
    if _PIN is None or not any(m.name == "xdist_group" for m in request.node.iter_markers()):
        yield
        return
    import fcntl
    import gc
    import tempfile
    with open(Path(tempfile.gettempdir()) / f"kp-test-gpu-{_PIN}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:  # what this worker's allocator keeps cached after a test in this process is the next one's room
            gc.collect()  # (the other worker pinned to this GPU may run a 36 GiB softmax case next)
            if torch.cuda.is_initialized():
                torch.cuda.empty_cache()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    marked = [it for it in items if any(m.args[:1] == ("gpu",) for m in it.iter_markers("xdist_group"))]
    deal = gpu_groups([it.nodeid for it in marked], len(GPUS))
    for it in marked:
        if it.nodeid in deal:
            it.own_markers = [m for m in it.own_markers if m.name != "xdist_group"]
            it.add_marker(pytest.mark.xdist_group(deal[it.nodeid]))


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
