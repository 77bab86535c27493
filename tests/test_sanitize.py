"""--sanitize without a GPU: compute-sanitizer's reports (as its tools wrote them on an H200, tests/data/sanitize) read
into hazards, a hazard counted only in a kernel of the row's own, each tool's failure kind, a pass that could not run
said and never a rejection, the record's part valid against the schema, and the CPU's skip said. The judge cases
under tests/judge_cases/contract/sanitize run on the GPU (test_judge_cases.py)."""

import json
import re
import types
from pathlib import Path

import pytest
from cases import CASES_DIR, meta

from kp.judge import sanitize
from kp.judge.clock import StageClock
from kp.judge.expected import Row

DATA = Path(__file__).parent / "data" / "sanitize"
ROOT = Path(__file__).resolve().parents[1]
OWN = {"void row_sum_kernel<2>(float const*, float*, float*, long, long)": "CUDA C++, judge_case_row_sum.so"}


def report(name: str) -> str:
    return (DATA / name).read_text()


def test_a_memcheck_report_is_one_hazard_with_its_kernel_thread_and_address():
    (h,) = sanitize.parse_report(report("memcheck_oob.txt"), "memcheck")  # the API error it caused is not one
    assert h.what == "Invalid __global__ read of size 4 bytes"
    assert h.kernel == "void row_sum_kernel<(int)1>(const float *, float *, float *, long, long)"
    assert h.where == "by thread (96,0,0) in block (199,0,0)"
    assert "373 bytes after the nearest allocation" in h.address and "33,579,008 bytes" in h.address
    assert h.said().startswith("Invalid __global__ read of size 4 bytes, in void row_sum_kernel<(int)1>")


def test_racecheck_names_both_accesses_and_a_kernel_not_the_rows_own_is_not_counted():
    hazards = sanitize.parse_report(report("racecheck.txt"), "racecheck")
    assert [h.what for h in hazards] == [
        "Race reported between Write access and Read access [42360 hazards]",
        "Race reported between Write access and Read access [12 hazards]",
    ]
    mine, others = sanitize.own_hazards(hazards, OWN)
    assert [h.kernel[: len("void row_sum_kernel<(int)2>")] for h in mine] == ["void row_sum_kernel<(int)2>"]
    assert [h.kernel.split("<")[0] for h in others] == ["void at::native::reduce_kernel"]
    assert sanitize.own_hazards(hazards, {}) == ([], hazards)  # no kernel of its own: nothing of its own


def test_an_initcheck_report_and_a_clean_one():
    (h,) = sanitize.parse_report(report("initcheck.txt"), "initcheck")
    assert h.what == "Uninitialized __global__ memory read of size 4 bytes" and h.address == "Address 0x7f100e202420"
    assert sanitize.parse_report(report("clean.txt"), "racecheck") == []
    assert sanitize.parse_report("", "memcheck") == []  # a tool that wrote nothing (it could not start)


def _run():
    return types.SimpleNamespace(notes=[], clock=StageClock())


def _tool_run(tool: str, kind: str, text: str = "", ran: bool = True, why=None, own=False, hazards=None):
    found = hazards if hazards is not None else sanitize.parse_report(text, tool)
    return sanitize.ToolRun(tool, kind, found, ran, why, text, 1.5, 0, own=own)


# Each tool's report as it wrote it on an H200 for a judge case (tests/judge_cases/contract/sanitize), and the start of
# the reason it gives.
REPORTED = [
    (
        "memcheck",
        "memory_error",
        "memcheck_oob.txt",
        "sanitize: compute-sanitizer memcheck: Invalid __global__ read",
        "wrong_reads_past_end.py",
    ),
    (
        "racecheck",
        "race",
        "racecheck.txt",
        "sanitize: compute-sanitizer racecheck: Race reported between Write",
        "wrong_race.py",
    ),
    (
        "initcheck",
        "memory_error",
        "initcheck.txt",
        "sanitize: compute-sanitizer initcheck: Uninitialized",
        "wrong_uninitialised.py",
    ),
]


@pytest.mark.parametrize("tool,kind,name,said,case", REPORTED)
def test_a_hazard_in_a_kernel_of_its_own_rejects_with_the_tools_kind(tool, kind, name, said, case):
    row = Row("candidate", None, own_kernels={k.replace("<2>", n): v for k, v in OWN.items() for n in ("<1>", "<3>")})
    row.own_kernels.update(OWN)
    run, out = _run(), {"rows": {}}
    clean = _tool_run("synccheck", "race", report("clean.txt"))
    sanitize._verdict(run, row, [clean, _tool_run(tool, kind, report(name))], out)
    assert not row.accepted and row.reason.startswith(said), row.reason
    assert row.failure["kind"] == kind and row.failure["check"] == f"sanitize ({tool})"
    # the judge case this report came from declares the reason and kind the tool's own words give (its kernel as the
    # tool demangles it: `void row_sum_kernel<(int)1>(...)`), as the GPU suite asserts them
    declared = meta(CASES_DIR / "contract" / "sanitize" / case)
    assert re.search(declared["EXPECT"], row.reason) and declared["KIND"] == kind, (declared, row.reason)
    entry = out["rows"]["candidate"]
    assert entry[tool]["hazards"] == 1 and entry["synccheck"]["hazards"] == 0
    assert entry[tool]["report"] == report(name)


def test_a_pass_that_could_not_run_is_said_and_a_hazard_not_its_own_is_not_counted():
    row = Row("candidate", None, own_kernels={"void other_kernel(float*)": "CUDA C++, x.so"})
    run, out = _run(), {"rows": {}}
    p = sanitize.Pass("memcheck", "memory_error", None, None, "its worker did not start")
    broken = sanitize._finish(p, *sanitize._run_pass(run, row, p, {}, ()))
    assert not broken.ran and broken.why == "its worker did not start"
    sanitize._verdict(run, row, [broken, _tool_run("racecheck", "race", report("racecheck.txt"))], out)
    assert row.accepted, row.reason
    assert "compute-sanitizer memcheck could not run candidate: its worker did not start" in run.notes
    assert any(
        n.startswith("compute-sanitizer racecheck: 2 report(s) in kernels not candidate's own") for n in run.notes
    )
    assert out["rows"]["candidate"]["racecheck"]["others"] == 2


def test_the_shared_memory_pass_rejects_as_its_own_and_its_record_is_valid():
    import jsonschema

    row = Row("candidate", None, own_kernels=OWN)
    run, out = _run(), {"shape": "2048x4099 (the benchmark's)", "rows": {}}
    what = "its output is NaN or Inf at 2048 of 2048 positions that are finite with shared memory filled with 0x00"
    found = [sanitize.Hazard(sanitize.SHARED, what, None, None, None)]
    passes = [_tool_run("memcheck", "memory_error", report("clean.txt"))]
    passes.append(_tool_run(sanitize.SHARED, "memory_error", own=True, hazards=found))
    sanitize._verdict(run, row, passes, out)
    assert row.reason.startswith(f"sanitize: shared memory: {what}") and row.failure["kind"] == "memory_error"
    schema = json.loads((ROOT / "kp" / "record.schema.json").read_text())
    jsonschema.validate(out, schema["properties"]["sanitize"])


def test_on_the_cpu_sanitize_is_skipped_out_loud(tmp_path, cli):
    d = ROOT / "tests" / "judge_cases" / "relu"
    r = cli(
        "--ref",
        d / "ref.py",
        "--candidate",
        d / "torch_rewrite.py",
        "--allow-torch",
        "--device",
        "cpu",
        "--sanitize",
        "--json",
        tmp_path / "r.json",
    )
    rec = json.loads((tmp_path / "r.json").read_text())
    assert r.returncode == 0 and rec["status"] == "accepted", r.stdout + r.stderr
    said = "--sanitize: compute-sanitizer checks GPU kernels, and this judgement runs on the CPU"
    assert said in rec["skipped"] and said in r.stderr
    assert "sanitize" not in rec
