"""Gradients judged (--backward, kp.judge.backward): the judge cases of tests/judge_cases/contract/backward each run
through the judge cases' own tests with their FLAGS (--backward among them); here, what they must show besides."""
import pytest

from cases import CASES_DIR, meta
from kp.judge.backward import Grads

BACKWARD = CASES_DIR / "contract" / "backward"
WRONG_GRADS = [p.name for p in sorted(BACKWARD.glob("wrong_*.py"))]


def test_the_backward_cases_cover_each_defect():
    names = " ".join(WRONG_GRADS)
    for needed in ("derivative", "no_bias_grad", "no_grad_forward", "stale_saved", "assigns_grad"):
        assert needed in names
    assert {"autograd_rewrite.py", "function_rewrite.py"} <= {p.name for p in BACKWARD.glob("*.py")}


@pytest.mark.parametrize("name", WRONG_GRADS)
def test_a_wrong_gradient_with_a_right_forward_is_accepted_without_backward(cli, tmp_path, name):
    """Each wrong-gradient case's forward is right: judged as KernelBench judges (no --backward) it is accepted."""
    m = meta(BACKWARD / name)
    if "cpu" not in m["DEVICES"]:
        pytest.skip("judged on a GPU only")
    flags = [f for f in m["FLAGS"] if f != "--backward"]
    r = cli("--ref", BACKWARD / "ref.py", "--candidate", BACKWARD / name, "--device", "cpu", "--seed", "5",
            "--no-sandbox", *flags)
    last = r.stdout.strip().splitlines()[-1]
    assert r.returncode == 0 and last.startswith("accepted"), r.stdout + r.stderr


def test_accumulated_expectations_add_the_call_befores_parameter_gradients():
    import torch
    a = Grads(upstream=[], seed=1, inputs={}, params={"w": (torch.ones(2), torch.ones(2, dtype=torch.float64), 4.0)})
    b = Grads(upstream=[], seed=2, inputs={}, params={"w": (torch.full((2,), 2.0),
                                                            torch.full((2,), 2.0, dtype=torch.float64), 4.0)})
    s = b.plus(a)
    assert not s.zero and s.request()["zero"] is False
    assert torch.equal(s.params["w"][0], torch.full((2,), 3.0)) and s.params["w"][1].dtype == torch.float64
    assert b.plus(None) is b
