"""tools/judge_corpus: the classification of a run's verdicts and the re-reading of over-budget rejections."""
import json

from tools import judge_corpus

REF = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.rand(8, 16384)]


def get_init_inputs():
    return []
'''


def _results(tmp_path, verdicts):
    ref = tmp_path / "l1_p23.py"
    ref.write_text(REF)
    lines = [{"key": str(i), "job": {"name": f"l1_p23: c{i}.py", "ref": ["file", str(ref)], "opts": {"mode": "train"}},
              "ok": v.startswith("accepted"), "verdict": v} for i, v in enumerate(verdicts)]
    f = tmp_path / "results.jsonl"
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return f


def test_floors_reads_a_softmax_rejection_against_its_row_length(tmp_path):
    """A softmax keeps its input's shape but sums rows of 16384: 2.0e-06 fits the floor 2 u sqrt(16384) = 1.5e-05,
    a tanh-for-erf error of 2e-04 does not."""
    f = _results(tmp_path, [
        "rejected: trial 1 (seed 1): relL2 1.98e-06 over budget 1.00e-06 (worst row 4.28e-06, row budget 1.00e-06)",
        "rejected: trial 1 (seed 1): relL2 1.98e-04 over budget 1.00e-06 (worst row 2.04e-04, row budget 1.00e-06)",
        "accepted (kernelbench: pass (1e-4), pass (1e-2))"])
    lines = judge_corpus.floors(f).splitlines()
    assert len(lines) == 2 and "K 16384, floor 1.53e-05" in lines[0]
    assert lines[0].endswith("within the budget now") and lines[1].endswith("still over")


def test_classify_names_each_cause_once_per_mode(tmp_path):
    f = _results(tmp_path, ["accepted (kernelbench: pass (1e-4), pass (1e-2))",
                            "rejected: trial 1 (seed 1): input 0 was modified"])
    out = judge_corpus.classify(f, md=False)
    assert out.startswith("2 jobs") and "1  accepted" in out and "1  input modified" in out


def test_out_of_memory_is_no_verdict_or_the_rows_own_doing():
    """The two ends of a row's out-of-memory error (kp.judge.driver.Judge._out_of_memory) are classed apart."""
    assert judge_corpus.cause("error: l1_p2: candidate ran out of GPU memory after other processes took 54.3 GiB of "
                              "the GPU during the run (...): no verdict").startswith("no verdict: the GPU's memory")
    assert judge_corpus.cause("rejected: trial 1 (seed 1): raised OutOfMemoryError: CUDA out of memory. ...; no "
                              "other process took GPU memory during the run") == \
        "out of GPU memory, its own process's doing"
