"""run.py's usage errors and exit codes (no GPU needed)."""
import subprocess
import sys

import harness
from conftest import HAS_GPU, gpu

import pytest


def run(*args):
    return subprocess.run([sys.executable, "run.py", *args], cwd=harness.ROOT, capture_output=True, text=True)


def test_list():
    r = run("--list")
    assert r.returncode == 0
    for p in harness.problems():
        assert sum(line.startswith(p + ":") for line in r.stdout.splitlines()) == 1


def test_unknown_problem_lists_problems_exit_2():
    r = run("--problem", "nope")
    assert r.returncode == 2
    assert "unknown problem 'nope'" in r.stderr and "softmax" in r.stderr and "Traceback" not in r.stderr


def test_unknown_variant_exit_2():
    r = run("--problem", "softmax", "--variant", "9_nope")
    assert r.returncode == 2 and "2_online" in r.stderr


def test_no_problem_exit_2():
    r = run()
    assert r.returncode == 2 and "--problem" in r.stderr


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU message")
def test_no_cuda_is_one_line_exit_2():
    r = run("--problem", "softmax")
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "no CUDA device" in r.stderr and "Traceback" not in r.stderr
