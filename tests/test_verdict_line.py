"""The verdict as a command prints it (kp.observe.verdict.verdict_lines): its last line starts with accepted or
rejected and is at most 200 characters; what does not fit goes on the lines above it, and the record keeps the whole
one-line verdict."""

from kp.observe.verdict import VERDICT_WIDTH, shorten, split_explanation, verdict, verdict_lines


def _rec(accepted: bool, reason: str = "", notes: tuple = ()) -> dict:
    row = {"accepted": accepted, "reason": reason, "checks": {}, "peer": False, "pure_torch": False, "own_kernels": {}}
    return {"rows": {"candidate": row}, "elapsed_s": 1.5, "notes_list": list(notes), "device": "cpu"}


def test_a_short_verdict_is_one_line_as_the_record_keeps_it():
    rec = _rec(False, "trial 1 (seed 5): relL2 1.00e+00 over budget 1.00e-06 (worst row 1.1e+00, row budget 1e-06)")
    assert verdict_lines(rec) == [verdict(rec)] and verdict(rec).endswith(" in 1.5 s")


def test_a_long_acceptance_puts_its_notes_above_the_verdict():
    notes = (
        "no float64 reference (fp32 only: the float64 copy raised TypeError: this model runs in float32 only)",
        "judged against PyTorch's fp32 output with relL2 budget 0.0001",
    )
    rec = _rec(True, notes=notes + ("x" * 60,))
    lines = verdict_lines(rec)
    assert len(verdict(rec)) > VERDICT_WIDTH
    assert lines[-1] == "accepted in 1.5 s (notes above)"
    assert lines[:-1] == [f"  note: {n}" for n in (*notes, "x" * 60)]


def test_a_long_rejection_keeps_the_failure_and_its_figures_on_the_last_line():
    figs = "relL2 1.45e-02 over budget 3.77e-06 (worst row 1.54e-02, row budget 3.77e-06)"
    why = (
        "it passed before the weights changed (optimizer step): a value derived from the weights is not "
        "recomputed (stale weight cache)"
    )
    rec = _rec(False, f"trial 2 (seed 6, after an optimizer step): {figs}; {why}", notes=("n" * 80,))
    lines = verdict_lines(rec)
    assert lines[-1] == f"rejected: trial 2 (seed 6, after an optimizer step): {figs} in 1.5 s"
    assert f"  why: {why}" in lines and f"  note: {'n' * 80}" in lines
    assert all(len(ln) <= VERDICT_WIDTH for ln in lines[-1:])


def test_a_reason_too_long_alone_is_shortened_on_the_last_line_and_said_whole_above():
    reason = (
        "trial 2 (seed 6, after an optimizer step): backward (upstream seed 7925, .grad accumulated over this "
        "call and the one before): the gradient of parameter 'fc.weight': relL2 1.02e+00 over budget 1.17e-06 "
        "(worst row 1.26e+00, row budget 1.17e-06)"
    )
    lines = verdict_lines(_rec(False, reason))
    assert len(lines[-1]) <= VERDICT_WIDTH and lines[-2] == f"  reason: {reason}"
    assert lines[-1] == (
        "rejected: trial 2 (seed 6, after an optimizer step): backward (...): the gradient of "
        "parameter 'fc.weight': relL2 1.02e+00 over budget 1.17e-06 (worst row 1.26e+00, row "
        "budget 1.17e-06) in 1.5 s"
    )
    cut = shorten("a " * 150, 50)
    assert len(cut) <= 50 and " ... " in cut


def test_the_explanation_is_split_at_its_first_top_level_semicolon():
    assert split_explanation("trial 1 (seed 1; x): relL2 2 (a; b); it matches eval mode; more") == (
        "trial 1 (seed 1; x): relL2 2 (a; b)",
        "it matches eval mode; more",
    )
    assert split_explanation("raised ValueError: bad") == ("raised ValueError: bad", "")


def test_the_judges_notes_are_said_once_where_a_verdict_follows_the_table():
    """A single command prints the table, then the verdict with the judge's notes: the table leaves them to it (the
    same note printed above the table and again above the verdict read as two events). Without a verdict after it
    (a problem's ladder), the table says them."""
    from kp.observe.report import format_record

    note = (
        "candidate at case peaked (seed 8): the gradient of input 0 over its budget, within how far honest "
        "fp32 roundings move the reference's there"
    )
    rec = {
        **_rec(True, notes=(note,)),
        "reference": "ref",
        "seed": 6,
        "torch": "2.13.0",
        "precision": "fp32",
        "footprint": {"inputs": 4, "outputs": 4, "weights": 0},
    }
    rec["rows"]["candidate"].update(rel_l2=1e-7, worst_row=5e-7)
    printed = format_record(rec, verdict_follows=True).splitlines() + verdict_lines(rec)
    assert sum(note in ln for ln in printed) == 1, printed
    assert any(note in ln for ln in format_record(rec).splitlines())


def test_the_checked_calls_line_says_at_how_many_the_gradients_were_checked():
    from kp.observe.report import checks_line

    fwd = {"rel_l2": 1e-7}
    both = {"rel_l2": 1e-7, "grads": {"input 0": 2e-7}}
    assert checks_line({"checks": {"trial 1": fwd, "trial 2": fwd}}) == "2 checked calls passed: 2 on fresh inputs"
    assert checks_line({"checks": {"trial 1": both, "trial 2": both}}).endswith("; gradients checked at every one")
    assert checks_line({"checks": {"trial 1": both, "timed 1": fwd}}) == (
        "2 checked calls passed: 1 on fresh inputs, 1 among the timed calls; gradients checked at 1 of them"
    )
