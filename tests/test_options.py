"""The judge's options as one value: its defaults in one place, checked once, the same from the command line, a job
and a session, and a job's key made from its pairs as before."""

import dataclasses

import pytest

import harness
import run
from kp.batch import jobfile
from kp.errors import UsageError
from kp.judge.options import JOB_TIMEOUT_S, JudgeOptions


def test_the_command_lines_defaults_are_the_options_defaults():
    assert run.judge_opts(run.parse_args(["--problem", "softmax"])) == JudgeOptions()
    opts = run.judge_opts(
        run.parse_args(
            [
                "--ref",
                "r.py",
                "--candidate",
                "c.py",
                "--no-bench",
                "--mode",
                "eval",
                "--shapes",
                "odd,double",
                "--backward",
                "--sanitize",
                "--timeout",
                "30",
            ]
        )
    )
    assert opts == JudgeOptions(
        bench=False, mode="eval", shapes=("odd", "double"), backward=True, sanitize=True, timeout_s=30.0
    )


@pytest.mark.parametrize(
    "bad,said",
    [
        ({"mode": "infer"}, "mode must be one of train, eval"),
        ({"precision": "fp8"}, "precision must be one of"),
        ({"trials": 2}, "at least 3 trials"),
        ({"device": "tpu"}, "device must be cuda or cpu"),
        ({"shapes": -1}, "a count of other shapes"),
        ({"shapes": ("sideways",)}, "no member 'sideways'"),
        ({"timeout_s": 0}, "positive number of seconds"),
        ({"allow_torc": True}, "unknown judge options \\['allow_torc'\\]"),
    ],
)
def test_a_bad_option_is_a_usage_error_when_the_options_are_made(bad, said):
    with pytest.raises(UsageError, match=said):
        JudgeOptions.from_mapping(bad)


def test_options_are_frozen_and_names_are_normalised():
    opts = JudgeOptions(shapes=["odd-half"])
    assert opts.shapes == ("odd half",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.seed = 3


def test_a_jobs_pairs_are_what_the_job_key_was_made_of_before_the_options_type():
    """A results file written by the command line before resumes: the pairs leave a default --shapes, --backward
    and --sanitize out, as the command line's options did."""
    before = (
        ("allow_torch", False),
        ("bench", True),
        ("compile_baseline", True),
        ("device", None),
        ("mode", "train"),
        ("ncu", False),
        ("precision", "fp32"),
        ("profile", False),
        ("sandbox", True),
        ("seed", None),
        ("timeout_s", JOB_TIMEOUT_S),
        ("trials", 3),
    )
    assert JudgeOptions().pairs() == before
    assert dict(JudgeOptions(shapes=4, backward=True).pairs())["shapes"] == 4
    assert dict(JudgeOptions(sanitize=True).pairs())["sanitize"] is True  # a job with it is another job
    job = jobfile.make_job(("problem", "softmax"), None, JudgeOptions(timeout_s=5))
    assert job.key() == jobfile.make_job(("problem", "softmax"), None, JudgeOptions()).key()  # a bound, not the job
    assert JudgeOptions.from_mapping(dict(job.opts)) == JudgeOptions(timeout_s=5)


def test_a_session_takes_the_same_options_and_refuses_an_unknown_one(tmp_path):
    from kp.batch.session import JudgeSession

    ref = tmp_path / "ref.py"
    ref.write_text("")
    with pytest.raises(UsageError, match="unknown judge options \\['benchh'\\]"):
        JudgeSession(ref, device="cpu", benchh=False)


def test_at_is_spelled_one_way_and_refused_in_one_line():
    from kp.judge.members import at_values, parse_at

    assert parse_at(None) is None and parse_at("test") == "test" and parse_at("odd-half") == "odd half"
    assert parse_at(" dim=8192, batch_size=64") == "batch_size=64,dim=8192"
    assert at_values("batch_size=64,dim=8192") == {"batch_size": 64, "dim": 8192}
    for bad in ("", "foo", "dim=0", "dim=x", "a=1,a=2", "1a=3"):
        with pytest.raises(UsageError, match="--at"):
            parse_at(bad)
    assert JudgeOptions(at="dim=3").pairs() == JudgeOptions(at="dim=3").pairs() != JudgeOptions().pairs()
    assert "at" not in dict(JudgeOptions().pairs())  # a results file written before --at resumes


def test_at_judges_the_shape_asked_and_the_record_says_so(tmp_path, cli):
    """--at on the CPU: a right candidate judged at the sizes asked, said in a note and the record's `at`; sizes the
    family has not, and a file without TEST_SIZES, are usage errors before anything runs."""
    import json

    cand = tmp_path / "softmax_torch.py"
    cand.write_text(
        "import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
        "        return torch.softmax(x, dim=1)\n"
    )
    r = cli(
        "--problem",
        "softmax",
        "--candidate",
        cand,
        "--allow-torch",
        "--device",
        "cpu",
        "--seed",
        "3",
        "--at",
        "batch_size=8,dim=4096",
        "--json",
        tmp_path / "r.json",
    )
    rec = json.loads((tmp_path / "r.json").read_text())
    assert r.returncode == 0 and rec["status"] == "accepted", r.stdout + r.stderr
    assert rec["shape"] == "8x4096" and rec["at"]["benchmark_shape"] == "4096x393216", rec["at"]
    assert rec["at"]["sizes"] == {"batch_size": [4096, 8], "dim": [393216, 4096]}
    assert "judged at 8x4096 (--at batch_size=8,dim=4096), not the benchmark's 4096x393216" in r.stdout
    r = cli("--problem", "softmax", "--candidate", cand, "--device", "cpu", "--at", "rows=3")
    assert r.returncode == 2 and "rows is not a positive size get_inputs() alone reads" in r.stderr, r.stderr
    relu = harness.ROOT / "tests" / "judge_cases" / "relu"
    r = cli("--ref", relu / "ref.py", "--candidate", relu / "torch_rewrite.py", "--device", "cpu", "--at", "test")
    assert r.returncode == 2 and "declares no TEST_SIZES" in r.stderr, r.stderr
