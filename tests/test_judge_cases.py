"""The judge on its cases: every known-wrong candidate (tests/wrong) rejected for its stated reason and every reference
in tests/judge_cases judged with its candidates through run.py from outside the repo (on the CPU in CI; on the GPU
in one batch over warm slots), and every shipped variant of every problem accepted."""

import json
import os
import re
from pathlib import Path

import pytest

import harness
from kp.judge import driver as judge
from conftest import gpu, run_script as run
import batched
from cases import CASES_DIR, PAIRS, WRONG, meta, missing, outside_repo, shipped_candidate


def test_every_wrong_case_declares_problem_reason_and_devices():
    from kp.errors import FAILURE_KINDS

    assert len(WRONG) >= 8
    for p in WRONG:
        m = meta(p)
        assert m.get("PROBLEM") in harness.problems(), p.name
        re.compile(m["EXPECT"])
        assert m["KIND"] in FAILURE_KINDS, p.name
        assert set(m["DEVICES"]) <= {"cuda", "cpu"} and m["DEVICES"], p.name
        assert m["BENCH_SHAPE"] is None or isinstance(m["BENCH_SHAPE"], str) and m["BENCH_SHAPE"], p.name


def test_judge_cases_cover_the_kinds_and_declare_verdicts():
    from kp.errors import FAILURE_KINDS

    folders = {d for d, _ in PAIRS if "/" not in d}
    assert len(folders) >= 7
    for d, c in PAIRS:
        m = meta(CASES_DIR / d / c)
        assert "EXPECT" in m and m["DEVICES"], (d, c)
        assert m["EXPECT"] is None or re.compile(m["EXPECT"])
        assert (m["KIND"] is None) == (m["EXPECT"] is None) and m["KIND"] in (None, *FAILURE_KINDS), (d, c)
    # each reference has a correct own-kernel candidate and a correct pure-PyTorch one
    for d in folders:
        kinds = {c for dd, c in PAIRS if dd == d and meta(CASES_DIR / dd / c)["EXPECT"] is None}
        assert "kernel.py" in kinds and "torch_rewrite.py" in kinds, d
    wrong = " ".join(f"{d}/{c}" for d, c in PAIRS if meta(CASES_DIR / d / c)["EXPECT"])
    for needed in ("stale_weights", "identity", "skip_last"):
        assert needed in wrong


@pytest.mark.parametrize("path", [p for p in WRONG if "cpu" in meta(p)["DEVICES"]], ids=lambda p: p.stem)
def test_wrong_case_rejected_on_cpu(path):
    m = meta(path)
    rec = judge.evaluate(m["PROBLEM"], path, seed=1234, device="cpu")
    r = rec["rows"]["candidate"]
    assert not r["accepted"], f"{path.name} was accepted"
    assert re.search(m["EXPECT"], r["reason"]), f"{path.name}: {r['reason']}"
    assert "\n" not in r["reason"]
    assert_typed(rec, "rejected", m["KIND"])


@pytest.mark.parametrize(
    "folder,cand", [p for p in PAIRS if "cpu" in meta(CASES_DIR / p[0] / p[1])["DEVICES"]], ids=lambda x: str(x)
)
def test_judge_case_on_cpu(tmp_path, cli, folder, cand):
    """run.py --ref FILE --candidate FILE --device cpu, both files outside the repo."""
    d = outside_repo(tmp_path, folder)
    m = meta(d / cand)
    r = cli(
        "--ref",
        d / "ref.py",
        "--candidate",
        d / cand,
        "--device",
        "cpu",
        "--seed",
        "11",
        "--json",
        tmp_path / "r.json",
        *m["FLAGS"],
    )
    last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr
    rec = json.loads((tmp_path / "r.json").read_text())
    if m["EXPECT"] is None:
        assert r.returncode == 0 and last.startswith("accepted") and len(last) <= 200, r.stdout + r.stderr
        assert "accepted (parity only on cpu" in last or "  note: parity only on cpu" in r.stdout, r.stdout
        assert_typed(rec, "accepted")
        assert rec["rows"]["candidate"]["pure_torch"] is None  # which kernels ran is not seen on the CPU
    else:  # the reason as the record keeps it: what the verdict line adds (notes, the box) is not the reason
        assert r.returncode == 1 and last.startswith("rejected: ") and len(last) <= 200, r.stdout + r.stderr
        reason = rec["rows"]["candidate"]["reason"]
        assert re.search(m["EXPECT"], reason), reason
        assert_typed(rec, "rejected", m["KIND"])


def assert_typed(rec: dict, status: str, kind: str | None = None) -> None:
    """The verdict as data: the record's status, and a rejection's failure of the case's declared kind (KIND), the
    stage it came in and the same failure on the candidate's row; an acceptance has none."""
    from kp.errors import FAILURE_KINDS
    from kp.judge.stages import AFTER_WORKERS, STAGES

    assert rec["status"] == status and rec["schema_version"] == 1, (rec["status"], rec.get("failure"))
    f = rec["failure"]
    if status == "accepted":
        assert f is None and rec["rows"]["candidate"]["failure"] is None, f
        return
    assert f == rec["rows"]["candidate"]["failure"] and f["kind"] in FAILURE_KINDS, f
    assert kind is None or f["kind"] == kind, (f, kind)
    assert f["stage"] in {s.name for s in (*STAGES, *AFTER_WORKERS)}, f


# The GPU judge cases and GPU known-wrong cases of this pytest process (its shard), judged in one batch: three warm
# slots on the visible GPU (tests/batched.py; a slot's job runs as the single command it stands for would, and a
# job left without a verdict for GPU memory the other slots held is judged again with the GPU to itself).
GPU_BATCHED = batched.GPU_BATCHED


# Slots on the one GPU a pytest process has: a core or more for each slot's judge and its candidate's worker, four
# at most (a slot short of GPU memory beside the others is judged again at the end with the GPU to itself)
SLOTS_PER_GPU = min(4, max(3, (os.cpu_count() or 1) // 4))


def _gpu_case_argv(test: str, p: dict, base: Path) -> list | None:
    """The single command a batched GPU test (its function's name, its parameters) stands for; None for a judge case
    whose modules are missing (the test skips). Judge cases are copied outside the repo first, once per folder."""
    if test == "test_wrong_case_rejected_on_gpu":  # at the problem's small test shape, unless the case says why not
        m = meta(p["path"])
        return [
            "--problem",
            m["PROBLEM"],
            "--candidate",
            p["path"],
            "--no-bench",
            *(() if m["BENCH_SHAPE"] else ("--at", "test")),
        ]
    d = base / p["folder"] if (base / p["folder"]).exists() else outside_repo(base, p["folder"])
    m = meta(d / p["cand"])
    if missing(m["NEEDS"]):
        return None
    flags = [f for f in m["FLAGS"] if f != "--sanitize" or test != "test_sanitize_case_accepted_without_it"]
    return ["--ref", d / "ref.py", "--candidate", d / p["cand"], "--no-compile", *flags]


@pytest.fixture(scope="session")
def gpu_batch(request, tmp_path_factory):
    from kp.batch.gpus import gpu_list

    base = tmp_path_factory.mktemp("gpu_cases")
    argvs = {
        it.nodeid: argv
        for it in request.session.items
        if getattr(it, "originalname", "") in GPU_BATCHED
        for argv in [_gpu_case_argv(it.originalname, it.callspec.params, base)]
        if argv is not None
    }
    return batched.judge_batch(argvs, gpu_list(",".join(["0"] * SLOTS_PER_GPU)), base / "batch")


@gpu
@pytest.mark.parametrize("path", [p for p in WRONG if "cuda" in meta(p)["DEVICES"]], ids=lambda p: p.stem)
def test_wrong_case_rejected_on_gpu(path, gpu_batch, request):
    """`run.py --problem P --candidate FILE --no-bench`, judged in the shard's batch (gpu_batch)."""
    m = meta(path)
    line = gpu_batch.get(request.node.nodeid)
    assert line is not None and batched.exit_code(line) == 1, f"{path.name}: {batched.said(line)}"
    r = line["record"]["rows"]["candidate"]
    assert not r["accepted"], f"{path.name} was accepted"
    assert re.search(m["EXPECT"], r["reason"]), f"{path.name}: {r['reason']}"
    assert line["status"] == "rejected" and line["failure"] == line["record"]["failure"]
    assert_typed(line["record"], "rejected", m["KIND"])


@gpu
@pytest.mark.parametrize(
    "folder,cand", [p for p in PAIRS if "cuda" in meta(CASES_DIR / p[0] / p[1])["DEVICES"]], ids=lambda x: str(x)
)
def test_judge_case_on_gpu(folder, cand, gpu_batch, request):
    """`run.py --ref FILE --candidate FILE --no-compile` on the GPU, both files outside the repo, the full stages,
    judged in the shard's batch (gpu_batch)."""
    m = meta(CASES_DIR / folder / cand)
    absent = missing(m["NEEDS"])
    if absent:
        pytest.skip(f"needs {', '.join(absent)}")
    line = gpu_batch.get(request.node.nodeid)
    if m["EXPECT"] is None:
        assert line is not None and batched.exit_code(line) == 0 and line["verdict"].startswith("accepted"), (
            batched.said(line)
        )
        rec = line["record"]
        row = rec["rows"]["candidate"]
        assert row["own_kernels"] or (
            "--allow-torch" in m["FLAGS"] and (row["pure_torch"] or row["library_kernels"])
        ), row
        if m["SAYS"]:
            assert re.search(m["SAYS"], line["verdict"]), line["verdict"]
        timed = [k for k in row["checks"] if k.startswith("timed call")]
        assert len(timed) >= 1, row["checks"].keys()
        if "--no-bench" not in m["FLAGS"]:  # a case judged as a search loop judges: no table, no baselines
            assert rec["peak_gpu_bytes"] > 0 and "candidate" in rec["timing"]
        assert_typed(rec, "accepted")
    else:
        assert line is not None and batched.exit_code(line) == 1 and line["verdict"].startswith("rejected: "), (
            batched.said(line)
        )
        reason = line["record"]["rows"]["candidate"]["reason"]
        assert re.search(m["EXPECT"], reason), reason
        assert_typed(line["record"], "rejected", m["KIND"])


# The --sanitize cases whose defect leaves every output right (tests/judge_cases/contract/sanitize)
SANITIZE_WRONG = [
    (f, c) for f, c in PAIRS if "--sanitize" in meta(CASES_DIR / f / c)["FLAGS"] and meta(CASES_DIR / f / c)["EXPECT"]
]


@gpu
@pytest.mark.parametrize("folder,cand", SANITIZE_WRONG, ids=lambda x: str(x))
def test_sanitize_case_accepted_without_it(folder, cand, gpu_batch, request):
    """Each --sanitize case rejected with it (test_judge_case_on_gpu) is accepted without it: its defect (a read past
    a tensor's end, an unwritten read, a race) leaves every output the judge checks right, and only the tools or the
    shared-memory fill see it. Judged in the shard's batch (gpu_batch)."""
    line = gpu_batch.get(request.node.nodeid)
    assert line is not None and batched.exit_code(line) == 0 and line["verdict"].startswith("accepted"), batched.said(
        line
    )
    assert_typed(line["record"], "accepted")
    assert "sanitize" not in line["record"]


def test_every_batched_gpu_case_is_a_command_run_py_takes(tmp_path):
    """Every GPU judge case and GPU known-wrong case, as its test hands it to the batch: run.py's parser takes the
    command, and the job it makes has the case's options (no CPU, the case's flags)."""
    cases = [("test_wrong_case_rejected_on_gpu", {"path": p}) for p in WRONG if "cuda" in meta(p)["DEVICES"]] + [
        ("test_judge_case_on_gpu", {"folder": f, "cand": c})
        for f, c in PAIRS
        if "cuda" in meta(CASES_DIR / f / c)["DEVICES"]
    ]
    cases += [("test_sanitize_case_accepted_without_it", {"folder": f, "cand": c}) for f, c in SANITIZE_WRONG]
    assert len(cases) >= 90 and len(SANITIZE_WRONG) == 4
    for test, params in cases:
        argv = _gpu_case_argv(test, params, tmp_path)
        if argv is None:
            continue
        job = batched.job_of(argv)
        opts = dict(job.opts)
        assert opts["device"] is None and Path(job.candidate).is_file() and job.key(), (test, params)
        assert opts["allow_torch"] == ("--allow-torch" in argv), (test, params)
        assert opts["bench"] == (test != "test_wrong_case_rejected_on_gpu" and "--no-bench" not in argv)
        assert opts.get("sanitize", False) == ("--sanitize" in argv)
        assert "--sanitize" not in argv or test != "test_sanitize_case_accepted_without_it", params
        wrong = test == "test_wrong_case_rejected_on_gpu"
        assert opts.get("at") == ("test" if wrong and not meta(params["path"])["BENCH_SHAPE"] else None), params
        assert not (test != "test_wrong_case_rejected_on_gpu" and opts["bench"] and opts["compile_baseline"])


def test_batched_cases_keep_each_commands_verdict(tmp_path, cli):
    """tests/batched.py, as the GPU tests use it, on two CPU slots: each case's result is found by its name, with the
    verdict, the record and the exit code that the same command gives run alone (here, in this process)."""
    d = outside_repo(tmp_path, "relu")
    cases = {
        "right": ["--ref", d / "ref.py", "--candidate", d / "torch_rewrite.py", "--allow-torch"],
        "wrong": ["--ref", d / "ref.py", "--candidate", d / "wrong_identity.py", "--allow-torch"],
    }
    cases = {k: [*v, "--device", "cpu", "--seed", "11"] for k, v in cases.items()}
    got = batched.judge_batch(cases, [None, None], tmp_path / "batch")
    assert set(got) == set(cases) and all(got.values()), got
    for name, argv in cases.items():
        alone = cli(*argv, "--json", tmp_path / f"{name}.json")
        line = got[name]
        assert batched.exit_code(line) == alone.returncode == (0 if name == "right" else 1), batched.said(line)
        took = re.compile(r" in [0-9.]+ s$")  # the verdict line ends with the job's wall time
        assert took.sub("", line["verdict"]) == took.sub("", alone.stdout.strip().splitlines()[-1])
        rec = json.loads((tmp_path / f"{name}.json").read_text())
        assert line["record"]["rows"]["candidate"]["reason"] == rec["rows"]["candidate"]["reason"]
        assert line["record"]["seed"] == rec["seed"] == 11
    assert re.search(meta(d / "wrong_identity.py")["EXPECT"], got["wrong"]["record"]["rows"]["candidate"]["reason"])


def _problem_rows():
    return [
        (p, prec) for p in harness.problems() for prec in getattr(harness.problem_module(p), "PRECISIONS", ("fp32",))
    ]


@gpu
@pytest.mark.parametrize("problem,precision", _problem_rows(), ids=lambda x: str(x))
def test_every_shipped_variant_accepted(problem, precision):
    """Every variant this GPU runs (records included), the dispatching default and every ROW_OPTIONS row through the
    judge's stages (the weight changes included), as run.py --problem runs them. Peer rows (somebody else's GEMM) are
    measured, not gated."""
    ref = judge.Reference.load(("problem", problem))
    rows = judge.default_variants(problem, include_records=True, precision=precision)
    rec = judge.evaluate(ref, None, rows, bench=False, precision=precision)
    bad = {k: r["reason"] for k, r in rec["rows"].items() if not r["accepted"] and not r["peer"]}
    assert not bad, bad
    # the problem's reference tells a right kernel from a cheat, but for the probes its module declares
    known = getattr(harness.problem_module(problem), "WEAK_PROBES", {}).get(precision, ())
    assert rec["probes"]["weak"] == list(known), rec["probes"]
    for k, r in rec["rows"].items():
        if r["accepted"] and not r["peer"]:
            assert r["own_kernels"], (k, r["kernels"])
            assert any(c.startswith("trial 3") for c in r["checks"]), k


@gpu
def test_cli_candidate_outside_repo_accepted(tmp_path):
    f = shipped_candidate(tmp_path, "softmax", "auto", {})
    r = run("--problem", "softmax", "--candidate", f, "--no-compile", "--json", tmp_path / "r.json")
    assert r.returncode == 0, r.stdout + r.stderr
    # the kernel of its own is named; on a host without bubblewrap the verdict also says it ran unboxed; KernelBench's
    # own check on the same candidate is always said
    last = r.stdout.strip().splitlines()[-1]
    assert re.fullmatch(
        r"accepted \(own kernel: softmax_regcluster \(CUDA C\+\+\); (unboxed: [^;]*; )?"
        r"KernelBench 1e-4 \w+, 1e-2 \w+\) in \d+\.\d s",
        last,
    ), last
    assert "peak GPU memory" in r.stdout and "own kernels" in r.stdout
