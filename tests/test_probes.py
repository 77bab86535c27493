"""The reference tested before it is trusted (kp.judge.probes): outputs no kernel computes (zeros, a constant, an
input passed through, the call before's output, the reference in bf16 and fp16), judged at the benchmark shape's
calls with each call's own budgets. A degenerate reference and a passthrough one are flagged, in the record and one
note; a reference that tells them apart is not, and the record says which call rejected each probe."""

from pathlib import Path

from kp.judge import driver as judge
from kp.observe import report, verdict
from cases import CASES_DIR

CONTRACT = CASES_DIR / "contract"


def _judged(folder: Path, cand: str | None):
    ref = judge.Reference.load(("file", str(folder / "ref.py")))
    return judge.evaluate(
        ref, folder / cand if cand else None, seed=5, device="cpu", allow_torch=True, sandbox=False, bench=False
    )


def test_a_degenerate_reference_is_flagged_once_beside_the_verdict():
    rec = _judged(CONTRACT / "weak_constant", "returns_ones.py")
    assert rec["status"] == "accepted"
    assert "constant" in rec["probes"]["weak"] and "zeros" not in rec["probes"]["weak"]
    notes = [n for n in rec["notes_list"] if "cannot tell a right kernel from" in n]
    assert len(notes) == 1 and "constant" in notes[0] and "at 4096x1" in notes[0], rec["notes_list"]
    assert "cannot tell a right kernel from constant" in verdict.verdict(rec)


def test_a_passthrough_reference_is_flagged_and_the_reference_alone_is_probed_too():
    rec = _judged(CONTRACT / "weak_passthrough", None)
    assert rec["probes"]["weak"] == ["input 0 passed through"]
    assert any("cannot tell a right kernel from input 0 passed through" in n for n in rec["notes_list"])
    table = "\n".join(report.probes_lines(rec))
    assert "input 0 passed through" in table and "weak: input 0 passed through" in table


def test_a_reference_that_tells_them_apart_gets_no_note_and_says_where_each_probe_fell():
    """ReLU of non-negative inputs is its input on fresh draws: the negated input is where passing it through
    fails. Every probe rejected; no note."""
    rec = _judged(CASES_DIR / "relu", "torch_rewrite.py")
    probes = rec["probes"]["probes"]
    assert rec["probes"]["weak"] == [] and not any("cannot tell" in n for n in rec["notes_list"])
    assert probes["input 0 passed through"]["calls"] == 3 and "negated" in probes["input 0 passed through"]["at"]
    assert probes["zeros"]["calls"] == 0 and probes["zeros"]["rel_l2"] == 1.0
    assert all(not p["accepted"] for p in probes.values())
    assert rec["stage_detail"]["parity: the reference's probes"] >= 0
