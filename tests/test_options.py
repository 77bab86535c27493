"""The judge's options as one value: its defaults in one place, checked once, the same from the command line, a job
and a session, and a job's key made from its pairs as before."""
import dataclasses

import pytest

import run
from kp.batch import jobfile
from kp.errors import UsageError
from kp.judge.options import JOB_TIMEOUT_S, JudgeOptions


def test_the_command_lines_defaults_are_the_options_defaults():
    assert run.judge_opts(run.parse_args(["--problem", "softmax"])) == JudgeOptions()
    opts = run.judge_opts(run.parse_args(["--ref", "r.py", "--candidate", "c.py", "--no-bench", "--mode", "eval",
                                          "--shapes", "odd,double", "--backward", "--timeout", "30"]))
    assert opts == JudgeOptions(bench=False, mode="eval", shapes=("odd", "double"), backward=True, timeout_s=30.0)


@pytest.mark.parametrize("bad,said", [({"mode": "infer"}, "mode must be one of train, eval"),
                                      ({"precision": "fp8"}, "precision must be one of"),
                                      ({"trials": 2}, "at least 3 trials"),
                                      ({"device": "tpu"}, "device must be cuda or cpu"),
                                      ({"shapes": -1}, "a count of other shapes"),
                                      ({"shapes": ("sideways",)}, "no member 'sideways'"),
                                      ({"timeout_s": 0}, "positive number of seconds"),
                                      ({"allow_torc": True}, "unknown judge options \\['allow_torc'\\]")])
def test_a_bad_option_is_a_usage_error_when_the_options_are_made(bad, said):
    with pytest.raises(UsageError, match=said):
        JudgeOptions.from_mapping(bad)


def test_options_are_frozen_and_names_are_normalised():
    opts = JudgeOptions(shapes=["odd-half"])
    assert opts.shapes == ("odd half",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.seed = 3


def test_a_jobs_pairs_are_what_the_job_key_was_made_of_before_the_options_type():
    """A results file written by the command line before resumes: the pairs leave a default --shapes and
    --backward out, as the command line's options did."""
    before = (("allow_torch", False), ("bench", True), ("compile_baseline", True), ("device", None), ("mode", "train"),
              ("ncu", False), ("precision", "fp32"), ("profile", False), ("sandbox", True), ("seed", None),
              ("timeout_s", JOB_TIMEOUT_S), ("trials", 3))
    assert JudgeOptions().pairs() == before
    assert dict(JudgeOptions(shapes=4, backward=True).pairs())["shapes"] == 4
    job = jobfile.make_job(("problem", "softmax"), None, JudgeOptions(timeout_s=5))
    assert job.key() == jobfile.make_job(("problem", "softmax"), None, JudgeOptions()).key()  # a bound, not the job
    assert JudgeOptions.from_mapping(dict(job.opts)) == JudgeOptions(timeout_s=5)


def test_a_session_takes_the_same_options_and_refuses_an_unknown_one(tmp_path):
    from kp.batch.session import JudgeSession
    ref = tmp_path / "ref.py"
    ref.write_text("")
    with pytest.raises(UsageError, match="unknown judge options \\['benchh'\\]"):
        JudgeSession(ref, device="cpu", benchh=False)
