import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from kp.lib import bytecode  # noqa: E402

bytecode.enable()  # before torch's import, as run.py does: where the host writes no bytecode, the cache keeps it
import torch  # noqa: E402

HAS_GPU = torch.cuda.is_available()
# Each judge on the CPU plans its benchmark-shape calls in this much host memory (kp.judge.plan.host_budget), not in
# three quarters of what the host has free: the suite runs several judges at once (xdist), each seeing the same free
# memory. A test that needs another budget sets its own.
os.environ.setdefault("KP_CPU_MEMORY", str(3 << 29))
# No batch precompiles torch's header in the background (kp.box.pch, 800 MB and a minute of a core per variant, in a
# cache a test removes); tests/test_pch.py turns it on where it tests it.
os.environ.setdefault("KP_PCH", "0")
# Every record a judgement of the suite makes, in this process or any it starts, is checked against the record's
# schema (kp/record.schema.json) as it is made: one that breaks it fails its judgement, and so its test.
os.environ["KP_VALIDATE_RECORDS"] = "1"
try:
    import jsonschema  # noqa: E402, F401
except ImportError:
    raise pytest.UsageError(
        "the suite validates every record it makes against kp/record.schema.json and needs jsonschema: "
        "pip install -r requirements.txt"
    ) from None


def gpu(test):
    """Needs a CUDA GPU. Every such test is in one xdist group, so under `-n` they run one at a time in one worker:
    the device is shared (two judges of the 12 GiB softmax problem do not fit an 80 GB card together), while the
    CPU tests spread over the other workers. A host of several GPUs runs one pytest per GPU, each on its share of
    the tests (`--shard K/N`, tools/gpu_tests.py)."""
    return pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")(pytest.mark.xdist_group("gpu")(test))


@pytest.fixture
def gpu_alone():
    """The GPU held against every judge on this host for the test (kp.lib.gpu_lock.gpu_to_itself, as a judge holds it
    to time): a test that times in its own process while another pytest process on the same GPU judges
    (tools/gpu_tests.py's lanes) has the GPU to itself as the judge's timing has. Only for a test that starts no
    judge of its own that would wait for the same hold."""
    from kp.lib import gpu_lock

    with gpu_lock.gpu_to_itself():
        yield


@pytest.fixture(autouse=True)
def _gpu_memory_back(request):
    """After a GPU test, this worker's cached GPU memory goes back to the device: a test that judged in this process
    (the `cli` fixture) leaves its allocator holding what it used, and the next test's judge, in a process of its
    own, needs that room (a softmax case plans 36 GiB; an 80 GB card does not hold two)."""
    yield
    if HAS_GPU and torch.cuda.is_initialized() and _is_gpu_test(request.node):
        import gc

        gc.collect()
        torch.cuda.empty_cache()


def pytest_addoption(parser):
    parser.addoption(
        "--shard",
        default=None,
        metavar="K/N",
        help="run the K-th of N shares of the tests (0-based), so N pytest processes, one per GPU, run "
        "the suite once together: GPU tests dealt by their recorded seconds "
        "(tests/gpu_test_seconds.json) so the shares end together, else round-robin; the others "
        "round-robin",
    )
    parser.addoption(
        "--lanes",
        type=int,
        default=1,
        metavar="L",
        help="with --shard: the shares are L lanes a GPU (several pytest processes on one GPU, "
        "tools/gpu_tests.py), share K on GPU K // L; the batched judge cases go to each GPU's first "
        "lane only (one batch a GPU), every other test to the lane with the least time so far",
    )
    parser.addoption(
        "--claims",
        default=None,
        metavar="DIR",
        help="with --shard: the GPU tests that may run on any share are not dealt but taken: every share lists "
        "them, and runs one only if it is the first to claim it (a file made in DIR, which the shares of one "
        "suite run share), so the shares end together whatever each test takes beside the others",
    )
    parser.addoption(
        "--only",
        choices=("gpu", "cpu"),
        default=None,
        help="gpu: only the tests marked as needing a GPU; cpu: only the others (tools/gpu_tests.py runs "
        "the GPU tests over the GPUs, then the others with the GPUs hidden, as CI runs them)",
    )


# Seconds each GPU test took in a recorded run (`python -m tools.gpu_tests --store-durations` writes it), by node id
# without xdist's "@group" suffix: the shares are dealt by them (shard_of).
GPU_SECONDS = Path(__file__).with_name("gpu_test_seconds.json")
UNRECORDED_S = 1.0  # a GPU test the record lacks (new, or under the record's cut): about what most of them take


def gpu_test_seconds(path: Path = GPU_SECONDS) -> dict[str, float]:
    """The record's seconds by node id; {} where there is none or it does not read."""
    try:
        return {k.split("@")[0]: float(v) for k, v in json.loads(path.read_text())["seconds"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def _batched(name: str) -> bool:
    from batched import GPU_BATCHED

    return name.split("::")[-1].split("[")[0] in GPU_BATCHED


def _on_batch_lane(name: str) -> bool:
    """A GPU test that goes to a GPU's first lane: a batched judge case, or one of the tests that run after the batch
    there (tests/batched.py's AFTER_BATCH)."""
    from batched import AFTER_BATCH

    return _batched(name) or name.split("::")[-1].split("[")[0] in AFTER_BATCH


def shard_of(
    names: list[str],
    gpu_names: set[str],
    k: int,
    n: int,
    seconds: dict[str, float] | None = None,
    lanes: int = 1,
    pooled: bool = False,
) -> list[str]:
    """The K-th of N shares. Without `seconds`: the GPU tests dealt round-robin among themselves (so each GPU gets its
    turn of the heavy ones, which sit together in the order). With them (a recorded run's, by node id): each GPU test,
    longest first, to the share with the least time so far (a longest-first greedy deal), so that the shares end
    together. The batched judge cases each count as an even part of the record's time for all of them (their
    batch's time falls on whichever case sets it up, but grows with every case a share has). The other tests are
    dealt round-robin either way, each share starting where the last left off. Every process of the N computes the
    same deal. With `lanes` (L pytest processes a GPU), the batched cases go only to the shares that are a GPU's
    first lane (K % L == 0): each GPU judges its cases in one batch; so do the tests that run after the batch
    (AFTER_BATCH), which that lane runs once its batch is done (pytest_collection_modifyitems). `pooled`: the GPU
    tests that may go to any share are not dealt but listed in every share, each run by the share that claims it
    first (--claims); only the tests of the batch's lanes are dealt, among those lanes."""
    gpu_tests = [x for x in names if x in gpu_names]
    cpu_tests = [x for x in names if x not in gpu_names]
    mine_cpu = set(cpu_tests[(k + len(gpu_tests)) % n :: n])
    first_lanes = [s for s in range(n) if s % lanes == 0]
    pinned = {x for x in gpu_tests if _on_batch_lane(x.split("@")[0])}
    pool = {x for x in gpu_tests if pooled and x not in pinned}
    dealt = [(x, first_lanes if x in pinned else list(range(n))) for x in gpu_tests if x not in pool]
    mine = pool | _deal(dealt, k, n, seconds)
    return [x for x in names if x in mine | mine_cpu]


def _deal(tests: list[tuple[str, list[int]]], k: int, n: int, seconds: dict[str, float] | None) -> set[str]:
    """The tests of share K among (node id, the shares it may go to): round-robin without `seconds`, else longest
    first to the least-loaded share it may go to (shard_of)."""
    if not seconds:
        turn, mine = {}, set()
        for x, shares in tests:
            key = len(shares)
            share = shares[turn.get(key, 0) % len(shares)]
            turn[key] = turn.get(key, 0) + 1
            if share == k:
                mine.add(x)
        return mine
    clean = [x.split("@")[0] for x, _ in tests]
    batched = [c for c in clean if _batched(c)]
    batch_total = sum(seconds.get(c, 0.0) for c in batched)  # the batches' setups, and each case's look-up
    batch_s = batch_total / len(batched) if batch_total > 0 else UNRECORDED_S
    cost = [batch_s if _batched(c) else seconds.get(c, UNRECORDED_S) for c in clean]
    load, mine = [0.0] * n, set()
    # the batched cases first (they have the fewest shares to go to), then every test longest first
    for i in sorted(range(len(tests)), key=lambda i: (len(tests[i][1]), -cost[i], i)):
        share = min(tests[i][1], key=lambda s: (load[s], s))
        load[share] += cost[i]
        if share == k:
            mine.add(tests[i][0])
    return mine


def _is_gpu_test(item) -> bool:
    return any(m.args[:1] == ("gpu",) for m in item.iter_markers("xdist_group"))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    only = config.getoption("--only")
    if only:
        drop = [it for it in items if _is_gpu_test(it) != (only == "gpu")]
        config.hook.pytest_deselected(items=drop)
        items[:] = [it for it in items if _is_gpu_test(it) == (only == "gpu")]
    spec = config.getoption("--shard")
    if not spec:
        return
    try:
        k, n = (int(v) for v in spec.split("/"))
        assert 0 <= k < n
    except (ValueError, AssertionError):
        raise pytest.UsageError(f"--shard {spec!r}: K/N with 0 <= K < N, e.g. --shard 0/4") from None
    gpu_names = {it.nodeid for it in items if _is_gpu_test(it)}
    lanes = config.getoption("--lanes")
    if lanes < 1 or n % lanes:
        raise pytest.UsageError(f"--lanes {lanes}: a count that divides the shares of --shard ({n})")
    pooled = bool(config.getoption("--claims"))
    keep = set(shard_of([it.nodeid for it in items], gpu_names, k, n, gpu_test_seconds(), lanes, pooled))
    config.hook.pytest_deselected(items=[it for it in items if it.nodeid not in keep])
    order = {x: i for i, x in enumerate(batch_first([it.nodeid for it in items if it.nodeid in keep]))}
    items[:] = sorted((it for it in items if it.nodeid in keep), key=lambda it: order[it.nodeid])
    for it in items:
        it.stash[CLAIMED] = pooled and it.nodeid in gpu_names and not _on_batch_lane(it.nodeid.split("@")[0])


# Whether a test is one of the pooled GPU tests (--claims): run by the share that claims it first.
CLAIMED = pytest.StashKey[bool]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """A pooled GPU test that another share claimed first is not run here (nor reported: that share reports it).
    What the test before it set up and kept for it (its module, its class, their fixtures) is torn down as its own
    teardown would have, up to the test after it: left set up, the next test of another module fails its setup
    ("previous item was not torn down properly")."""
    if item.stash.get(CLAIMED, False) and not claim(Path(item.config.getoption("--claims")), item.nodeid):
        item.session._setupstate.teardown_exact(nextitem)
        return True
    return None


def claim(folder: Path, nodeid: str) -> bool:
    """Whether this process is the first to claim the test: a file named for it, made only where none is (the
    filesystem's O_EXCL decides between shares that ask at once)."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(folder / hashlib.sha256(nodeid.encode()).hexdigest()[:32], os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.write(fd, f"{os.getpid()} {nodeid}\n".encode())
    os.close(fd)
    return True


def batch_first(names: list[str]) -> list[str]:
    """A share's tests in the order its pytest runs them: the batched judge cases first (the batch starts at once),
    then the tests that run after it (AFTER_BATCH), then the rest in the order they were collected."""
    return sorted(names, key=lambda x: (not _batched(x), not _on_batch_lane(x.split("@")[0])))


def run_script(*args, env=None, timeout=1200):
    """`python run.py ARGS` in a process of its own (the GPU tests: each judge gets a fresh device)."""
    import os

    return subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if env is None else {**os.environ, **env},
    )


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
