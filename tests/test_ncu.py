"""run.py --ncu: Nsight Compute's CSV read into per-row kernels (from a recorded sample), the bytes against the
minimum, the one-line outcomes where ncu is missing or refuses; on a GPU with ncu, a real run."""

import json
import os
import stat

import pytest

from conftest import ROOT, gpu, run_script
from kp.observe import ncu

# Recorded on an H100 (ncu 2025.3.1, `--csv --page raw`, the metrics of kp.observe.ncu.METRICS): three rows, each
# after a torch.cuda._sleep marker -- eager softmax of 4096x8192 fp32, a tensor copy_ (a cudaMemcpy: no kernel), a
# 1024^3 fp16 matmul. ncu's own notes and the program's output come first, then the header and the units row.
SAMPLE = (ROOT / "tests" / "data" / "ncu_sample.csv").read_text()
LABELS = ["eager", "copy", "hgemm"]


def test_sample_parses_into_kernels_with_counters():
    ks = ncu.parse_csv(SAMPLE)
    assert [k["id"] for k in ks] == [0, 1, 2, 3, 4]
    sm = ks[1]
    assert "cunn_SoftMaxForward" in sm["name"]
    assert sm["dram_read"] == 134_237_440 and sm["dram_write"] == 117_117_440 and sm["time_ns"] == 146_368
    assert sm["regs"] == 37 and sm["local_ld"] == 0 and sm["occupancy_pct"] == pytest.approx(49.19)
    assert ks[4]["tensor_pct"] == pytest.approx(27.81)  # the fp16 GEMM keeps the tensor pipe busy


def test_markers_split_the_kernels_into_rows():
    rows = ncu.split_rows(ncu.parse_csv(SAMPLE), LABELS)
    assert [len(rows[k]) for k in LABELS] == [1, 0, 1]  # copy_ ran no kernel (a device-to-device memcpy)
    with pytest.raises(ValueError, match="expected 4 marker kernels, ncu saw 3"):
        ncu.split_rows(ncu.parse_csv(SAMPLE), LABELS + ["extra"])


def test_bytes_against_the_minimum_and_bandwidth_against_copy():
    x = 4096 * 8192 * 4  # the softmax's minimum: read x once, write y once
    res = ncu.summarize(ncu.split_rows(ncu.parse_csv(SAMPLE), LABELS), {"eager": 2 * x}, copy_bw=3.0e12)
    e = res["eager"]
    assert e["x_min"] == pytest.approx((134_237_440 + 117_117_440) / (2 * x))
    k = e["kernels"][0]
    assert k["dram_pct"] == pytest.approx(100 * (134_237_440 + 117_117_440) / 146_368e-9 / 3.0e12)
    assert res["copy"]["kernels"] == [] and res["copy"]["x_min"] is None
    lines = ncu.format_ncu({"version": "2025.3.1", "copy_bw": 3.0e12, "rows": res})
    assert "ncu eager: 1 kernels, 0.146 ms, DRAM 0.134 GB read + 0.117 GB written, 0.94x the minimum" in "\n".join(
        lines
    )
    assert any("cunn_SoftMaxForwardReg" in ln for ln in lines)


def test_missing_ncu_is_one_clear_line(monkeypatch):
    monkeypatch.delenv("KP_NCU", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    res = ncu.run({"rows": []}, {}, None)
    assert res == {"error": "Nsight Compute (ncu) not found on PATH (or KP_NCU): no hardware counters"}
    assert ncu.format_ncu(res) == [f"  ncu: {res['error']}"]


def test_refusing_ncu_is_one_clear_line(tmp_path, monkeypatch):
    """ncu that cannot read the counters (no permission, a sandboxed runtime) says so; the run goes on."""
    fake = tmp_path / "ncu"
    fake.write_text(
        "#!/bin/sh\necho '==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access "
        "NVIDIA GPU Performance Counters' >&2\nexit 1\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("KP_NCU", str(fake))
    res = ncu.run({"rows": []}, {}, None)
    assert res["error"].startswith("ncu cannot read the counters here: ==ERROR== ERR_NVGPUCTRPERM")


@gpu
@pytest.mark.skipif(ncu.ncu_path() is None, reason="no ncu here")
def test_ncu_run_of_a_problem(tmp_path):
    """The lse problem's rows under ncu: every row has kernels, the cached rung reads about its minimum (x once),
    the uncached one also W (288 MiB in all)."""
    out = tmp_path / "rec.json"
    r = run_script(
        "--problem", "matmul_sum_max_mean_lse", "--variant", "4_overlap", "--no-compile", "--ncu", "--json", out
    )
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())["ncu"]
    assert "error" not in res, res
    rows = res["rows"]
    assert set(rows) >= {"eager", "4_overlap", "4_overlap[cache=False]"}
    assert all(rows[k]["kernels"] for k in rows)
    unc = rows["4_overlap[cache=False]"]
    assert 0.95 < unc["dram_read"] / (288 << 20) < 1.10, unc["dram_read"]
    assert "ncu 4_overlap[cache=False]:" in r.stdout
    assert os.path.exists(out)
