"""The warm judge (`run.py --warm`, kp.batch.server): a judge process kept between commands gives each command the
output, record and exit code it gives without it, and a later command on the same file is served by the same
process. No GPU needed (the commands judge on the CPU)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BATCH = ROOT / "tests" / "batch"


def _run(args, env, cwd):
    return subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=600,
    )


@pytest.fixture
def warm_env(tmp_path):
    """A temporary folder of its own: this test's warm judge is found by its commands alone, and stopped after."""
    env = {**os.environ, "TMPDIR": str(tmp_path), "KP_WARM_IDLE_S": "120"}
    yield env
    _run(["--warm-stop"], env, tmp_path)


def test_a_warm_judge_gives_each_command_its_own_verdict_record_and_exit_code(tmp_path, warm_env):
    common = ["--ref", BATCH / "ref.py", "--device", "cpu", "--allow-torch", "--warm"]
    starts = _run([*common, "--candidate", BATCH / "good.py"], warm_env, tmp_path)
    assert starts.returncode == 0 and "a warm judge is starting" in starts.stderr, starts.stderr[-2000:]
    assert "judged by the warm judge" not in starts.stderr  # the first command is judged in its own process

    first = _run([*common, "--candidate", BATCH / "good.py", "--json", "a.json"], warm_env, tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stdout.strip().splitlines()[-1].startswith("accepted"), first.stdout
    assert "judged by the warm judge" in first.stderr and "command 1 since its start" in first.stderr
    assert "--seed" in first.stderr.split("judged by the warm judge")[0]  # the judge's own progress lines, passed on
    pid = first.stderr.split("(pid ")[1].split(",")[0]
    rec = json.loads((tmp_path / "a.json").read_text())  # relative to the command's folder, as without --warm
    assert rec["rows"]["candidate"]["accepted"]

    wrong = _run([*common, "--candidate", BATCH / "wrong.py"], warm_env, tmp_path)
    assert wrong.returncode == 1 and wrong.stdout.strip().splitlines()[-1].startswith("rejected"), wrong.stdout
    both = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *map(str, common), "--candidate", BATCH / "wrong.py"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=warm_env,
        cwd=tmp_path,
        timeout=600,
    )  # 2>&1: the verdict is still the last line
    assert both.stdout.strip().splitlines()[-1].startswith("rejected"), both.stdout[-2000:]
    again = _run([*common, "--candidate", BATCH / "good.py"], warm_env, tmp_path)
    assert again.returncode == 0 and f"(pid {pid}, command 4 since its start" in again.stderr, again.stderr[-2000:]

    os.kill(int(pid), 9)  # a server gone without a word leaves its socket behind: the next command starts another
    time.sleep(0.5)
    after = _run([*common, "--candidate", BATCH / "good.py"], warm_env, tmp_path)
    assert after.returncode == 0 and "a warm judge is starting" in after.stderr, after.stderr[-2000:]
    served = _run([*common, "--candidate", BATCH / "good.py"], warm_env, tmp_path)
    assert served.returncode == 0 and "command 1 since its start" in served.stderr, served.stderr[-2000:]
    assert f"(pid {pid}," not in served.stderr

    usage = _run([*common, "--candidate", tmp_path / "missing.py"], warm_env, tmp_path)
    assert usage.returncode == 2 and "missing.py" in usage.stderr  # a usage error, said as run.py says it
    stopped = _run(["--warm-stop"], warm_env, tmp_path)
    assert "1 warm judge(s) stopped" in stopped.stdout


def test_a_command_with_other_settings_gets_a_judge_of_its_own(tmp_path, warm_env):
    """The KP_* settings are part of what a warm judge is for: a command with another budget is not served by a
    judge started under the first."""
    common = ["--ref", BATCH / "ref.py", "--candidate", BATCH / "good.py", "--device", "cpu", "--allow-torch", "--warm"]
    other = {**warm_env, "KP_CPU_MEMORY": str(1 << 30)}
    for env in (warm_env, other):  # each starts its own
        assert "a warm judge is starting" in _run(common, env, tmp_path).stderr
    a, b = _run(common, warm_env, tmp_path), _run(common, other, tmp_path)
    assert a.returncode == b.returncode == 0, (a.stderr[-1500:], b.stderr[-1500:])
    pid = lambda r: r.stderr.split("(pid ")[1].split(",")[0]
    assert pid(a) != pid(b)
    assert "2 warm judge(s) stopped" in _run(["--warm-stop"], warm_env, tmp_path).stdout
