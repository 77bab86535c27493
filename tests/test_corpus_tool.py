"""tools/judge_corpus: the classification of a run's verdicts and the re-reading of over-budget rejections."""

import json

from tools import judge_corpus

REF = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.rand(8, 16384)]


def get_init_inputs():
    return []
"""


def _results(tmp_path, verdicts, figures=None):
    """A results file of these verdicts; figures (one per verdict, or None): a rejection's failed check's figures,
    as the record's failure carries them."""
    ref = tmp_path / "l1_p23.py"
    ref.write_text(REF)
    figures = figures or [None] * len(verdicts)
    lines = [
        {
            "key": str(i),
            "job": {"name": f"l1_p23: c{i}.py", "ref": ["file", str(ref)], "opts": {"mode": "train"}},
            "ok": v.startswith("accepted"),
            "verdict": v,
            "record": {"failure": {"kind": "wrong_output", "figures": fig}} if fig else None,
        }
        for i, (v, fig) in enumerate(zip(verdicts, figures))
    ]
    f = tmp_path / "results.jsonl"
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return f


def test_floors_reads_a_softmax_rejection_against_its_row_length(tmp_path):
    """A softmax keeps its input's shape but sums rows of 16384: 2.0e-06 fits the floor 2 u sqrt(16384) = 1.5e-05,
    a tanh-for-erf error of 2e-04 does not."""
    f = _results(
        tmp_path,
        [
            "rejected: trial 1 (seed 1): relL2 1.98e-06 over budget 1.00e-06 (worst row 4.28e-06, row budget 1.00e-06)",
            "rejected: trial 1 (seed 1): relL2 1.98e-04 over budget 1.00e-06 (worst row 2.04e-04, row budget 1.00e-06)",
            "accepted (kernelbench: pass (1e-4), pass (1e-2))",
        ],
        [
            {"rel_l2": 1.98e-06, "worst_row": 4.28e-06, "budget": 1e-06, "row_budget": 1e-06},
            {"rel_l2": 1.98e-04, "worst_row": 2.04e-04, "budget": 1e-06, "row_budget": 1e-06},
            None,
        ],
    )
    lines = judge_corpus.floors(f).splitlines()
    assert len(lines) == 2 and "K 16384, floor 1.53e-05" in lines[0]
    assert lines[0].endswith("within the budget now") and lines[1].endswith("still over")


def test_classify_names_each_cause_once_per_mode(tmp_path):
    f = _results(
        tmp_path,
        ["accepted (kernelbench: pass (1e-4), pass (1e-2))", "rejected: trial 1 (seed 1): input 0 was modified"],
    )
    lines = [json.loads(ln) for ln in f.read_text().splitlines()]
    lines[0]["record"] = {"rows": {"candidate": {"own_kernels": ["k (CUDA C++)"]}}}
    lines[1]["failure"] = {"kind": "input_modified", "check": "trial 1 (seed 1)"}
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = judge_corpus.classify(f, md=False)
    assert out.startswith("2 jobs") and "1  accepted, own kernel" in out
    assert "1  input_modified: the candidate changed an input in place" in out


def test_causes_come_from_the_lines_data_never_their_words():
    """A result's cause is its status, its failure's kind and the call that showed it, and for no verdict what the
    line records (the GPU's memory, the judge's own traceback): the verdict's words are not read."""
    words = "rejected: words a reader would misread: ran out of GPU memory"
    no = {"ok": False, "status": "no_verdict", "verdict": words}
    assert judge_corpus.cause({**no, "gpu_memory": True}).startswith("no verdict: the GPU's memory")
    assert judge_corpus.cause({**no, "traceback": "Traceback ..."}) == "no verdict: the judge's own error"
    assert judge_corpus.cause(no) == "no verdict"
    bad = {"ok": False, "status": "rejected", "verdict": words}
    oom = {**bad, "failure": {"kind": "out_of_memory", "check": "trial 1 (seed 1)"}}
    assert judge_corpus.cause(oom) == "out_of_memory: the candidate's own work ran out of GPU memory"
    timed = {**bad, "failure": {"kind": "wrong_output", "check": "timed call 3"}}
    assert judge_corpus.cause(timed).endswith("(at a timed call)")
    member = {**bad, "failure": {"kind": "wrong_output", "check": "at 63x999: trial 1 (seed 1)"}}
    assert judge_corpus.cause(member).endswith("(at another shape of its family)")
    library = {"ok": True, "status": "accepted", "verdict": words, "record": {"rows": {"candidate": {}}}}
    library["record"]["rows"]["candidate"]["library_kernels"] = ["_rms_norm_forward_kernel (liger_kernel's Triton)"]
    assert judge_corpus.cause(library) == "accepted, a library's kernels"


def test_a_reference_short_of_shared_gpu_memory_is_judged_again_alone(tmp_path, monkeypatch):
    """Five references at a time on one GPU: one that found its memory taken by the others gets no verdict (exit 2);
    it is judged again alone after the rest, and only that answer is recorded. Out of memory on the CPU is not
    retried (nothing else shares it)."""
    for name in ("a.py", "b.py", "c.py"):
        (tmp_path / name).write_text(REF)
    calls = []

    def fake(path, device, timeout, precision="fp32"):
        calls.append(path.name)
        short = path.name == "b.py" and calls.count("b.py") == 1
        last = (
            (
                "error: b: the GPU ran out of memory in the judge's own process after import (10.2 GiB free now; the "
                "plan needs 18.0 GiB): another process took GPU memory during the run"
            )
            if short
            else "ok"
        )
        return {
            "ref": path.name,
            "code": 2 if short else 0,
            "traceback": False,
            "elapsed_s": 1.0,
            "eager": "",
            "skipped": [],
            "notes": [],
            "last": last,
        }

    monkeypatch.setattr(judge_corpus, "_judge_ref", fake)
    out = tmp_path / "refs.jsonl"
    judge_corpus.judge_refs(tmp_path, out, "cuda", 3, 60)
    recs = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert [(r["ref"], r["code"], r.get("alone", False)) for r in recs] == [
        ("a.py", 0, False),
        ("c.py", 0, False),
        ("b.py", 0, True),
    ]
    assert calls.count("b.py") == 2
    calls.clear()
    out_cpu = tmp_path / "cpu.jsonl"
    judge_corpus.judge_refs(tmp_path, out_cpu, "cpu", 3, 60)
    assert calls.count("b.py") == 1 and len(out_cpu.read_text().splitlines()) == 3


def test_two_versions_side_by_side_cold_then_warm(tmp_path, capsys):
    """bench.judge.corpus_pair: both versions (here this checkout twice) judge the same job file on the CPU, cold
    and then warm, each into results of its own; the table and the four comparisons say the verdicts agree."""
    from conftest import ROOT
    from bench.judge import corpus_pair

    batch = ROOT / "tests" / "batch"
    jobs = tmp_path / "jobs.csv"
    jobs.write_text(
        f"reference,candidate\n{batch / 'ref.py'},{batch / 'good.py'}\n{batch / 'ref.py'},{batch / 'wrong.py'}\n"
    )
    assert (
        corpus_pair.main(
            [
                "--jobs",
                str(jobs),
                "--before",
                str(ROOT),
                "--device",
                "cpu",
                "--limit",
                "600",
                "--out",
                str(tmp_path / "out"),
                "--args",
                "--allow-torch --timeout 300",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    for run in ("cold_before", "cold_after", "warm_before", "warm_after"):
        lines = [json.loads(x) for x in (tmp_path / "out" / f"{run}.jsonl").read_text().splitlines()]
        assert sorted(x["ok"] for x in lines) == [False, True], run
        assert f"| {run}.jsonl | 2 |" in out
    assert out.count("2 jobs in both runs (2 and 2 recorded); 0 changed cause") == 4, out


def test_a_run_past_the_limit_is_stopped_as_ctrl_c_stops_it():
    """A version's run still going at the phase's limit gets SIGINT (its records so far are kept), not a kill."""
    import signal
    import subprocess
    import sys
    import time
    from bench.judge import corpus_pair

    # a run is run.py, which takes SIGINT back where it was started with it ignored (kp.errors.stopped_by_signals)
    run = (
        "import signal, time; signal.signal(signal.SIGINT, signal.default_int_handler); print('up', flush=True); "
        "time.sleep(60)"
    )
    p = subprocess.Popen([sys.executable, "-c", run], start_new_session=True, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "up\n"  # running its code (a loaded host starts Python slowly), as a run is
    t0 = time.monotonic()
    assert corpus_pair.stop_by([p], t0 + 0.5) in ([-signal.SIGINT], [1])  # Python ends on SIGINT by it, or 1
    assert time.monotonic() - t0 < 30


def test_each_version_gets_its_slots_a_gpu_the_way_its_run_py_takes_them(tmp_path):
    """A version whose run.py has --slots is given it (a GPU listed once would otherwise get that version's default
    count); an older one gets each GPU listed once per slot."""
    from bench.judge import corpus_pair

    new, old = tmp_path / "new", tmp_path / "old"
    for tree, text in ((new, 'ap.add_argument("--slots")\n'), (old, 'ap.add_argument("--gpus")\n')):
        tree.mkdir()
        (tree / "run.py").write_text(text)
    args = (tmp_path / "jobs.csv", tmp_path / "out.jsonl", ["0", "1"], 3, "cuda", [])
    assert corpus_pair.command(new, *args)[-4:] == ["--gpus", "0,1", "--slots", "3"]
    assert corpus_pair.command(old, *args)[-2:] == ["--gpus", "0,0,0,1,1,1"]
    assert corpus_pair.command(old, *args[:4], "cpu", [])[-2:] == ["--device", "cpu"]


def test_pace_says_where_the_job_seconds_went_and_how_many_found_the_reference_run_ahead(tmp_path):
    ahead = "setup: the reference run once in the candidate's process, ahead of the job"
    recs = [
        {
            "elapsed_s": 10,
            "ok": True,
            "record": {
                "gpu_wait_s": 1,
                "stage_detail": {ahead: 0.0},
                "stage_seconds": {"build": 2, "setup and baselines": 0.5},
            },
        },
        {
            "elapsed_s": 10,
            "ok": False,
            "record": {"gpu_wait_s": 0, "stage_detail": {}, "stage_seconds": {"setup and baselines": 1.5}},
        },
        {"elapsed_s": 0, "ok": False, "record": None},
    ]
    f = tmp_path / "warm.jsonl"
    f.write_text("".join(json.dumps({"key": str(i), **r}) + "\n" for i, r in enumerate(recs)))
    row = judge_corpus.pace([f]).splitlines()[-1]
    assert row == "| warm.jsonl | 3 | 20 | 1 s (5%) | 2 s (10%) | 2 s (10%) | 15 s (75%) | 1 | 1 |"
