"""The judge a search loop keeps warm (kp.batch.session.JudgeSession): slots started once, candidates as files or
as source text, a verdict per candidate with the fields of a `--out` record, in the order given."""

from pathlib import Path

import pytest

from kp.batch.session import JudgeSession
from kp.box import sandbox
from kp.errors import UsageError

BATCH = Path(__file__).resolve().parent / "batch"
WRONG_SOURCE = (BATCH / "wrong.py").read_text()


def test_a_session_judges_files_and_source_text_in_order_on_warm_slots():
    with JudgeSession(BATCH / "ref.py", slots=2, device="cpu", allow_torch=True, timeout_s=120) as judge:
        first = judge(BATCH / "good.py")
        assert first["ok"] and first["verdict"].startswith("accepted") and first["record"]["rows"]["candidate"]
        many = judge.many([BATCH / "good.py"], sources=[WRONG_SOURCE, WRONG_SOURCE])
        assert [v["ok"] for v in many] == [True, False, False], [v["verdict"] for v in many]
        same = lambda v: v["verdict"].rsplit(" in ", 1)[0]  # the verdict, without its seconds
        assert many[1]["verdict"].startswith("rejected: trial 1") and same(many[1]) == same(many[2])
        assert {"ok", "verdict", "elapsed_s", "summary", "record", "job", "gpu"} <= set(many[0])
        seeds = {v["record"]["seed"] for v in [first, *many]}
        assert len(seeds) == 1  # every candidate of the session meets the same inputs and weights
        slots = [s.proc.pid for s, _ in judge.slots]
    assert all(pid for pid in slots)


def test_a_session_refuses_what_it_cannot_judge():
    with pytest.raises(UsageError, match="neither a file nor a built-in problem"):
        JudgeSession("no_such_ref.py", device="cpu")
    with pytest.raises(UsageError, match="unknown judge options"):
        JudgeSession(BATCH / "ref.py", device="cpu", bench_mark=False)


@pytest.mark.skipif(sandbox.status()[0] is None, reason=f"no sandbox here: {sandbox.status()[1]}")
def test_a_loops_next_version_of_a_candidate_finds_its_box_started(tmp_path):
    """A loop that judges one candidate at a time, each a new version (a text, or its file edited in place): after
    each job the slot starts a box for the same file, and the next version's job takes it (the record's
    `boxes_started_ahead`) and is judged on its own contents."""
    good = (BATCH / "good.py").read_text()
    with JudgeSession(BATCH / "ref.py", slots=2, device="cpu", allow_torch=True, timeout_s=120) as judge:
        texts = [judge(source=good), judge(source=good + "# v2\n"), judge(source=WRONG_SOURCE)]
        assert [v["ok"] for v in texts] == [True, True, False], [v["verdict"] for v in texts]
        assert [v["record"]["boxes_started_ahead"] for v in texts[1:]] == [[True], [True]]
        cand = tmp_path / "cand.py"
        cand.write_text(WRONG_SOURCE)
        files = [judge(cand)]
        with open(cand, "w") as f:  # edited in place, as an editor or a loop's write does
            f.write(good)
        files.append(judge(cand))
        assert [v["ok"] for v in files] == [False, True], [v["verdict"] for v in files]
        assert files[1]["record"]["boxes_started_ahead"] == [True]


def test_a_session_writes_nothing_to_its_callers_stdout_and_records_the_failed_checks_figures():
    """A library's caller owns its stdout: the session's slots print nothing there. A rejection keeps the failed
    check's numbers in the record (checks[label], passed False), not only inside the reason."""
    import subprocess
    import sys

    code = (
        "import json, sys; from kp.batch.session import JudgeSession\n"
        f"with JudgeSession({str(BATCH / 'ref.py')!r}, device='cpu', allow_torch=True, timeout_s=120) as j:\n"
        f"    v = j(source={WRONG_SOURCE!r})\n"
        "sys.stderr.write(json.dumps(v['record']['rows']['candidate']['checks']))\n"
        "print('DONE')\n"
    )
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=root)
    assert r.stdout == "DONE\n", r.stdout[-2000:] + r.stderr[-2000:]
    import json

    checks = json.loads(r.stderr.strip().splitlines()[-1])
    failed = [v for v in checks.values() if v.get("passed") is False]
    assert len(failed) == 1 and failed[0]["rel_l2"] > failed[0]["budget"], checks
