"""run.py --plot: the roofline picture of a judge's timing table, from a recorded table (the JSON record of a run
on an H200), and the one-line refusal when matplotlib is missing."""

import json
import re
import sys

import pytest

from conftest import ROOT
from kp.observe import plot, report
from kp.errors import UsageError

RECORD = ROOT / "tests" / "data" / "relu_record.json"  # `run.py --ref ... --candidate ...` on an H200, 2026-11-22
PNG = b"\x89PNG\r\n\x1a\n"


def test_points_are_the_tables_numbers():
    rec = json.loads(RECORD.read_text())
    pts = plot.points(rec)
    assert [p["label"] for p in pts] == report.row_names(rec)
    table = report.format_record(rec)
    for p in pts:
        line = next(ln for ln in table.splitlines() if ln.startswith(p["label"] + " "))
        assert f"{100 * p['roof']:5.1f}%" in line  # the picture's share of the ceiling is the table's %roof
        assert f"{p['bytes_per_s'] / 1e9:8,.0f}" in line
    assert {p["kind"] for p in pts} == {"baseline", "accepted"}


def test_roofline_of_a_recorded_table(tmp_path):
    pytest.importorskip("matplotlib")
    out = plot.roofline(json.loads(RECORD.read_text()), tmp_path / "relu.png")
    assert out.read_bytes()[:8] == PNG and out.stat().st_size > 10_000


def test_roofline_with_flops(tmp_path):
    """A compute-bound table (numbers made up for the drawing, not measured): rows sit at their intensity."""
    pytest.importorskip("matplotlib")
    rec = {
        "reference": "gemm",
        "shape": "8192x8192",
        "precision": "fp32",
        "bound": "compute",
        "bandwidth": 4.0e12,
        "flops_rate": 50e12,
        "rates": {"fp32": 50e12, "tf32": 400e12},
        "traffic": {"eager": {"bytes": 805306368, "flops": 1.1e12}},
        "timing": {
            "eager": {"median_ms": 25.0, "q1_ms": 24.9, "q3_ms": 25.1, "host_us": 10.0},
            "mine": {"median_ms": 30.0, "q1_ms": 29.9, "q3_ms": 30.1, "host_us": 10.0},
        },
        "rows": {
            "mine": {"accepted": False, "checks": {}, "pure_torch": False, "peer": False, "reason": "over budget"}
        },
    }
    pts = plot.points(rec)
    assert [p["kind"] for p in pts] == ["baseline", "rejected"]
    assert pts[0]["intensity"] == pytest.approx(1.1e12 / 805306368)
    assert pts[0]["roof"] == pytest.approx((1.1e12 / 50e12) / 25e-3)
    out = plot.roofline(rec, tmp_path / "gemm.png")
    assert out.read_bytes()[:8] == PNG


def test_nothing_timed_is_a_clear_error(tmp_path):
    rec = json.loads(RECORD.read_text())
    rec.pop("timing")
    with pytest.raises(UsageError, match="no timing table"):
        plot.roofline(rec, tmp_path / "x.png")


def test_without_matplotlib_plot_is_refused_before_the_run(cli, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    r = cli("--ref", ROOT / "tests" / "batch" / "ref.py", "--device", "cpu", "--plot", tmp_path / "x.png")
    assert r.returncode == 2 and re.search(r"--plot needs matplotlib.*pip install matplotlib", r.stderr)
    assert not (tmp_path / "x.png").exists()


def test_plot_takes_one_run(cli, tmp_path):
    r = cli(
        "--ref",
        ROOT / "tests" / "batch" / "ref.py",
        "--candidate",
        ROOT / "tests" / "batch" / "good.py",
        "--device",
        "cpu",
        "--out",
        tmp_path / "o.jsonl",
        "--plot",
        tmp_path / "x.png",
    )
    assert r.returncode == 2 and "--plot draws one run's table" in r.stderr


def test_a_saved_record_is_redrawn_from_the_command_line(tmp_path):
    """python -m kp.observe.plot RECORD.json OUT.png: the picture of a run, drawn later on a machine without a GPU."""
    pytest.importorskip("matplotlib")
    out = tmp_path / "again.png"
    assert plot.main([str(ROOT / "tests" / "data" / "relu_record.json"), str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_row_faster_than_its_ceiling_is_said():
    """The recorded table with its copy ceiling cut to 40%: every timed row now beats what the ceiling allows, and the
    table says so under itself, naming them, rather than let %roof above 100 pass as a figure."""
    rec = json.loads(RECORD.read_text())
    assert "faster than the ceiling" not in report.format_record(rec)
    rec["bandwidth"] *= 0.4
    table = report.format_record(rec)
    note = next(ln for ln in table.splitlines() if "faster than the ceiling" in ln)
    assert all(report.row_label(rec, k) in note for k in report.row_names(rec) if k in rec["timing"])
