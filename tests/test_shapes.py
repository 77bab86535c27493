"""Several shapes per reference (--shapes N): the family a reference's module-level sizes span, and candidates right
at the benchmark's shape only, which KernelBench's one-shape contract accepts. No GPU needed."""

import pytest

from cases import CASES_DIR
from conftest import gpu
from kp.judge import driver as judge, family_parity
from kp.observe import verdict

FOLDER = CASES_DIR / "contract" / "shapes"
WRONG = sorted(FOLDER.glob("wrong_*.py"))


def _ref():
    return judge.Reference.load(("file", str(FOLDER / "ref.py")))


def test_the_family_is_odd_half_one_and_double_of_the_sizes_get_inputs_alone_reads():
    ref = _ref()
    members, none = ref.family(6)
    assert none is None
    assert [(m, {k: v[1] for k, v in s.items()}) for m, s in members] == [
        ("odd", {"batch_size": 63, "dim": 999}),
        ("half", {"batch_size": 32, "dim": 500}),
        ("one", {"batch_size": 1}),
        ("double", {"batch_size": 128, "dim": 2000}),
        ("odd half", {"batch_size": 33, "dim": 501}),
        ("odd double", {"batch_size": 129, "dim": 2001}),
    ]
    assert ref.module.batch_size == 64 and ref.module.dim == 1000  # tried, not kept
    literal = judge.Reference.load(("file", str(CASES_DIR.parent / "batch" / "ref.py")))
    assert literal.family(4) == ([], "no module-level size that get_inputs() alone reads sets its inputs' shapes")


@pytest.mark.parametrize("path", WRONG, ids=lambda p: p.stem)
def test_a_candidate_right_at_the_benchmark_shape_only_is_accepted_without_shapes(path):
    """KernelBench's contract is one shape: without --shapes each known-wrong candidate of the family passes."""
    rec = judge.evaluate(_ref(), path, seed=11, device="cpu", allow_torch=True, sandbox=False)
    assert rec["rows"]["candidate"]["accepted"], rec["rows"]["candidate"]["reason"]
    assert "family" not in rec


@gpu
@pytest.mark.parametrize("path", WRONG, ids=lambda p: p.stem)
def test_a_candidate_right_at_the_benchmark_shape_only_is_accepted_without_shapes_on_gpu(path):
    """The same on the GPU, every stage run (the judge cases reject each under --shapes there)."""
    rec = judge.evaluate(_ref(), path, seed=11, device="cuda", allow_torch=True, bench=False)
    assert rec["rows"]["candidate"]["accepted"], rec["rows"]["candidate"]["reason"]
    assert "family" not in rec


def test_with_shapes_the_record_lists_each_member_and_the_sizes_are_put_back():
    ref = _ref()
    rec = judge.evaluate(
        ref, FOLDER / "torch_rewrite.py", seed=11, device="cpu", allow_torch=True, sandbox=False, shapes=2
    )
    row = rec["rows"]["candidate"]
    assert row["accepted"], row["reason"]
    assert [(f["member"], f["shape"], f["passed"]) for f in rec["family"]] == [
        ("odd", "63x999", ["candidate"]),
        ("double", "128x2000", ["candidate"]),
    ]
    assert sum(c.startswith("at 63x999: ") for c in row["checks"]) == 6  # fresh, changed weights, derived inputs
    assert ref.module.batch_size == 64 and ref.module.dim == 1000


def test_a_member_too_large_for_the_host_is_judged_scaled_to_fit_with_its_row_length_kept(monkeypatch):
    """On the CPU a member the host has no room for is made smaller as the benchmark's own shape would be (the batch
    halved, the row kept), judged there and said, not skipped."""
    from kp.judge import family_parity, parity_stage, plan

    ref = _ref()
    g = vars(ref.module)

    def need_at(batch, dim):
        old = g["batch_size"], g["dim"]
        g.update(batch_size=batch, dim=dim)
        try:
            return plan.cpu_need(ref._meta_footprint())
        finally:
            g.update(batch_size=old[0], dim=old[1])

    budget = (need_at(64, 2000) + need_at(128, 2000)) // 2
    for module in (parity_stage, family_parity):  # the benchmark's shape's room, and each member's
        monkeypatch.setattr(module, "host_budget", lambda: budget)
    rec = judge.evaluate(
        ref, FOLDER / "torch_rewrite.py", seed=11, device="cpu", allow_torch=True, sandbox=False, shapes=("double",)
    )
    [entry] = rec["family"]
    assert entry["shape"] == "64x2000" and entry["passed"] == ["candidate"], entry
    assert "batch_size 128 -> 64" in entry["scaled"]
    assert any("double sizes judged at 64x2000" in n for n in rec.get("notes_list") or []), rec.get("notes_list")
    assert ref.module.batch_size == 64 and ref.module.dim == 1000


def test_shapes_on_a_reference_without_a_family_is_said_not_silent():
    ref = judge.Reference.load(("file", str(CASES_DIR.parent / "batch" / "ref.py")))
    rec = judge.evaluate(
        ref, CASES_DIR.parent / "batch" / "good.py", seed=11, device="cpu", allow_torch=True, sandbox=False, shapes=3
    )
    assert rec["rows"]["candidate"]["accepted"] and rec["family"] == []
    assert any(s.startswith("other shapes (--shapes 3): no module-level size") for s in rec["skipped"])


@pytest.mark.parametrize(
    "problem", ["softmax", "matmul_gelu_softmax", "matmul_sum_max_mean_lse", "gemm_bn_scale_softmax"]
)
def test_each_built_in_problem_has_a_family(problem):
    """The built-in problems' sizes are module-level as KernelBench's files have them: the batch (and the softmax's
    row length) move, the linear layers' features, which the model's weights are made from, stay."""
    ref = judge.Reference.load(("problem", problem))
    members, _ = ref.family(("odd", "half", "one", "double"))
    assert [m for m, _ in members] == ["odd", "half", "one", "double"]
    assert set(members[0][1]) == ({"batch_size", "dim"} if problem == "softmax" else {"batch_size"})


def test_a_count_takes_the_members_a_file_declares_first_spread_over_its_list():
    """The softmax declares its sweep's row lengths (SHAPE_FAMILY): a count picks them spread from the shortest to
    the longest row, each at the benchmark's number of elements; past the list, the generic members follow."""
    ref = judge.Reference.load(("problem", "softmax"))
    n_elems = ref.module.batch_size * ref.module.dim
    members, _ = ref.family(6)
    dims = [sizes["dim"][1] for _, sizes in members]
    assert [m for m, _ in members] == ["declared"] * 6
    assert dims == [1024, 4096, 8192, 32768, 65536, 262144]
    assert all(sizes["batch_size"][1] * sizes["dim"][1] == n_elems for _, sizes in members)
    more, _ = ref.family(len(ref.module.SHAPE_FAMILY) + 2)
    assert [m for m, _ in more][-3:] == ["declared", "odd", "double"]  # two generic members: a larger one of them


FIXED = CASES_DIR / "contract" / "shapes_fixed"


def test_a_size_the_model_takes_at_no_other_value_is_held_in_every_member():
    """An image network's first layer fixes its input channels while get_inputs() alone reads the channel count:
    moved, the reference raises (on the meta device, at the odd value and at the double), so the members move the
    batch and the image's extents only, and the record's note says which size was held."""
    ref = judge.Reference.load(("file", str(FIXED / "ref.py")))
    assert ref.fixed_sizes(ref.family_sizes()) == ["in_channels"]
    members, none = ref.family(4)
    assert none is None and [m for m, _ in members] == ["odd", "half", "one", "double"]
    assert all("in_channels" not in sizes for _, sizes in members)
    assert ref.held_sizes == ["in_channels"] and ref.module.in_channels == 3


def test_two_sizes_that_must_stay_equal_move_together_and_are_not_held(tmp_path):
    """Two inputs added elementwise, each width its own module-level size: either moved alone is refused, both moved
    together are taken, so neither is held and every member moves both."""
    ref_file = tmp_path / "ref.py"
    ref_file.write_text(
        "import torch\nimport torch.nn as nn\n\nbatch_size = 8\nwidth_a = 64\nwidth_b = 64\n\n\n"
        "class Model(nn.Module):\n    def forward(self, a, b):\n        return a + b\n\n\n"
        "def get_inputs():\n"
        "    return [torch.randn(batch_size, width_a), torch.randn(batch_size, width_b)]"
        "\n\n\ndef get_init_inputs():\n    return []\n"
    )
    ref = judge.Reference.load(("file", str(ref_file)))
    assert ref.fixed_sizes(ref.family_sizes()) == []
    members, _ = ref.family(2)
    assert [{k: v[1] for k, v in s.items()} for _, s in members] == [
        {"batch_size": 7, "width_a": 63, "width_b": 63},
        {"batch_size": 16, "width_a": 128, "width_b": 128},
    ]


def test_a_small_count_of_shapes_takes_a_larger_member_and_finds_a_count_written_in():
    """--shapes 2 and 3 take double in the place of their last member (odd, double; odd, half, double): every
    smaller member leaves a candidate right for the benchmark's 64 rows only right there, as --shapes 2 once
    accepted one. 4 and more take MEMBERS' order, double among them already; 1 takes odd."""
    from kp.judge.members import count_order

    ref = judge.Reference.load(("file", str(FOLDER / "ref.py")))
    for n, want in ((1, ["odd"]), (2, ["odd", "double"]), (3, ["odd", "half", "double"])):
        assert count_order(n)[:n] == want
        assert [m for m, _ in ref.family(n)[0]] == want
    assert [m for m, _ in ref.family(4)[0]] == ["odd", "half", "one", "double"]
    rec = judge.evaluate(
        ref, FOLDER / "wrong_fixed_rows.py", seed=3, device="cpu", allow_torch=True, sandbox=False, shapes=2
    )
    row = rec["rows"]["candidate"]
    assert not row["accepted"] and "wrong at 128x2000 (double sizes)" in row["reason"], row["reason"]


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_a_member_the_reference_raises_at_is_skipped_and_said_and_the_next_one_judged(mode):
    """A BatchNorm training on a batch of one raises in the reference itself: in training mode that member is
    skipped, said in the verdict's skips and the record, and --shapes 4 still judges four members (the next one
    in its place); in eval mode the reference takes a batch of one and it is judged. The candidate is right."""
    ref = judge.Reference.load(("file", str(FIXED / "ref.py")))
    rec = judge.evaluate(
        ref, FIXED / "torch_rewrite.py", seed=11, device="cpu", allow_torch=True, sandbox=False, shapes=4, mode=mode
    )
    row = rec["rows"]["candidate"]
    assert row["accepted"], row["reason"]
    judged = [f["member"] for f in rec["family"] if f.get("passed")]
    skipped = {f["member"]: f["skipped"] for f in rec["family"] if f.get("skipped")}
    if mode == "train":
        assert judged == ["odd", "half", "double", "odd half"]
        assert list(skipped) == ["one"] and "Expected more than 1 value per channel" in skipped["one"]
        assert any("one sizes (batch_size 6 -> 1): the reference raises there" in s for s in rec["skipped"])
        assert "--shapes: 4 other shapes judged; not judged at one (the reference raises there)" in rec["notes_list"]
    else:
        assert judged == ["odd", "half", "one", "double"] and not skipped
    assert any("in_channels held at the file's value" in n for n in rec["notes_list"])
    assert ref.module.batch_size == 6 and ref.module.height == 12


def test_a_member_whose_footprint_runs_out_of_gpu_memory_is_skipped_for_room(monkeypatch):
    """A model the meta device cannot run is measured by a real forward; at a member that forward may find no room:
    that member is skipped as one without room, said, and the job goes on (not an out-of-memory end)."""
    import torch

    ref = judge.Reference.load(("file", str(FIXED / "ref.py")))
    real = type(ref).footprint

    def footprint(self, device, train=True):
        if self.module.batch_size == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
        return real(self, device, train)

    monkeypatch.setattr(type(ref), "footprint", footprint)
    rec = judge.evaluate(
        ref,
        FIXED / "torch_rewrite.py",
        seed=11,
        device="cpu",
        allow_torch=True,
        sandbox=False,
        shapes=("odd", "one"),
        mode="eval",
    )
    assert rec["rows"]["candidate"]["accepted"], rec["rows"]["candidate"]["reason"]
    assert [(f["member"], f.get("skipped", "")[:7]) for f in rec["family"]] == [("odd", ""), ("one", "no room")]
    assert any("one sizes (batch_size 6 -> 1): no room" in s for s in rec["skipped"])
    assert "--shapes: 1 other shape judged; not judged at one (no room)" in verdict.verdict(rec)


def test_a_declared_member_that_sets_a_size_outside_the_family_is_a_usage_error(monkeypatch):
    """A size the model or get_init_inputs() reads would change the model itself: refused before anything runs."""
    ref = _ref()
    monkeypatch.setattr(ref.module, "SHAPE_FAMILY", [{"batch_size": 8, "hidden": 4}], raising=False)
    with pytest.raises(judge.UsageError, match="hidden"):
        ref.family(2)


def test_a_member_larger_than_the_benchmark_is_judged_only_where_the_gpu_has_room(monkeypatch):
    """On a GPU a member larger than the benchmark's shape needs its growth (the plan's need and the float64
    forward's peak) in what is free now; a smaller one always fits, as the benchmark's did."""
    from kp.judge import family_parity

    fp = lambda n: {"inputs": n, "outputs": n, "weights": 0, "peak": 2 * n, "flops": 0, "rows": 64}
    no_room = lambda member: family_parity.no_room_for(member, fp(2 << 30), "cuda", "cuda", 1)  # noqa: E731
    monkeypatch.setattr(family_parity, "free_gpu_bytes", lambda: 10 << 30)
    # double the benchmark's 2 GiB inputs: about 17 GiB more
    assert "GiB of GPU memory more than the benchmark's shape, 10.0 GiB are free" in no_room(fp(4 << 30))
    assert no_room(fp(1 << 30)) is None
    monkeypatch.setattr(family_parity, "free_gpu_bytes", lambda: 40 << 30)
    assert no_room(fp(4 << 30)) is None


def test_a_built_in_problem_is_loaded_at_its_files_sizes_whatever_a_judge_before_left():
    """A built-in problem's module is one per process: a judge that judged a smaller shape puts its sizes back, and
    every load starts from the file's sizes anyway (a batch slot judges job after job in one process)."""
    ref = judge.Reference.load(("problem", "softmax"))
    ref.module.batch_size = 7  # as a judge stopped mid-run would leave it
    assert judge.Reference.load(("problem", "softmax")).module.batch_size == 4096


def test_shapes_takes_a_count_or_members_by_name():
    from kp.errors import UsageError
    from kp.judge.members import parse_shapes

    assert parse_shapes("4") == 4 and parse_shapes("odd,odd-double") == ("odd", "odd double")
    with pytest.raises(UsageError, match="no member 'triple'; a count, or some of odd, half, one, double"):
        parse_shapes("odd,triple")
    members, _ = _ref().family(("double", "odd"))
    assert [m for m, _ in members] == ["odd", "double"]  # in the family's order


def test_shapes_by_name_on_the_command_line(tmp_path, cli):
    r = cli(
        "--ref",
        FOLDER / "ref.py",
        "--candidate",
        FOLDER / "wrong_fixed_rows.py",
        "--device",
        "cpu",
        "--allow-torch",
        "--seed",
        "11",
        "--shapes",
        "double",
        "--no-sandbox",
    )
    assert r.returncode == 1 and r.stdout.strip().splitlines()[-1].startswith(
        "rejected: shapes: right at 64x1000 only, wrong at 128x2000 (double sizes)"
    ), r.stdout[-400:]
    assert "  shapes judged: 64x1000 (the benchmark's), 128x2000 (double) wrong" in r.stdout, r.stdout[-800:]
    r = cli(
        "--ref", FOLDER / "ref.py", "--candidate", FOLDER / "torch_rewrite.py", "--device", "cpu", "--shapes", "triple"
    )
    assert r.returncode == 2 and "--shapes: no member 'triple'" in r.stdout + r.stderr


def _timed_record() -> dict:
    """A record as a judge timed with --shapes 2 writes it: the benchmark's timing, then each member's."""

    def t(ms):
        return {"median_ms": ms, "q1_ms": ms, "q3_ms": ms, "host_us": 5.0}

    traffic = lambda n: {"bytes": 8 * n, "flops": 0}
    return {
        "reference": "ref",
        "shape": "64x1000",
        "device": "cuda",
        "precision": "fp32",
        "bandwidth": 4e12,
        "rows": {"candidate": {"accepted": True, "checks": {}, "reason": None}},
        "timing": {"eager": t(0.02), "torch.compile": t(0.01), "candidate": t(0.005)},
        "traffic": {"eager": traffic(64000)},
        "family": [
            {
                "member": "odd",
                "shape": "63x999",
                "sizes": {},
                "passed": ["candidate"],
                "timing": {"eager": t(0.02), "torch.compile": t(0.01), "candidate": t(0.04)},
                "traffic": {"eager": traffic(62937)},
            },
            {"member": "double", "shape": "128x2000", "skipped": "no room"},
        ],
    }


def test_the_speed_curve_is_a_row_per_shape_timed_with_speedups_and_the_ceilings_share():
    from kp.observe.report import curve, family_lines

    rec = _timed_record()
    pts = curve(rec)
    assert [(p["shape"], p["member"]) for p in pts] == [("64x1000", "benchmark"), ("63x999", "odd")]
    assert pts[0]["vs_eager"]["candidate"] == pytest.approx(4.0) and pts[1]["vs_eager"]["candidate"] == 0.5
    assert pts[1]["vs_compile"]["candidate"] == pytest.approx(0.25)
    assert pts[0]["roof"]["candidate"] == pytest.approx(8 * 64000 / 4e12 / 5e-6)
    lines = family_lines(rec)
    assert any("63x999" in ln and "0.50x" in ln and "0.25x" in ln for ln in lines), lines
    assert not any("128x2000" in ln for ln in lines)  # skipped there: no point, said in the record's skips


def test_the_speed_curve_is_drawn_where_matplotlib_is(tmp_path):
    pytest.importorskip("matplotlib")
    from kp.observe import plot

    said = plot.draw(_timed_record(), tmp_path / "curve.png")
    assert (tmp_path / "curve.png").stat().st_size > 0 and (tmp_path / "curve-roofline.png").stat().st_size > 0
    assert said.startswith("speed curve")
    rec = _timed_record()
    del rec["family"]
    assert plot.draw(rec, tmp_path / "one.png").startswith("roofline picture")


@gpu
def test_with_timing_each_member_is_timed_beside_eager_and_compile():
    """--shapes with timing on a GPU: every member parity passed at is timed side by side, the benchmark's sizes
    are put back after, and the table has a row per shape."""
    from kp.observe.report import format_record

    ref = _ref()
    rec = judge.evaluate(ref, FOLDER / "torch_rewrite.py", seed=11, device="cuda", allow_torch=True, shapes=2)
    assert rec["rows"]["candidate"]["accepted"], rec["rows"]["candidate"]["reason"]
    for entry in rec["family"]:
        assert {"eager", "torch.compile", "candidate"} <= set(entry["timing"]), entry
        assert entry["traffic"]["eager"]["bytes"] > 0
    assert ref.module.batch_size == 64 and ref.module.dim == 1000
    text = format_record(rec)
    assert "63x999" in text and "128x2000" in text and "at each shape timed" in text


def test_a_member_where_other_processes_took_the_gpus_memory_is_no_verdict_not_a_skip(monkeypatch):
    """Out of GPU memory at a member because other processes took it (GpuMemoryShort): the whole job has no
    verdict, as at the benchmark's shape, and a batch judges it again with the GPU to itself. Skipped instead (and
    said as the reference raising), a candidate wrong only at the largest member was accepted on a shared GPU."""
    from kp.errors import GpuMemoryShort

    ref = judge.Reference.load(("file", str(FIXED / "ref.py")))
    real = family_parity.parity_bench

    def parity_bench(run, init, at=None):
        if at and ref.module.batch_size == 1:
            raise GpuMemoryShort(
                f"{ref.name}: candidate ran out of GPU memory after other processes took 7.0 GiB "
                f"of the GPU during the run: no verdict; judge again with the GPU to itself"
            )
        return real(run, init, at)

    monkeypatch.setattr(family_parity, "parity_bench", parity_bench)
    with pytest.raises(GpuMemoryShort, match="other processes took"):
        judge.evaluate(
            ref,
            FIXED / "torch_rewrite.py",
            seed=11,
            device="cpu",
            allow_torch=True,
            sandbox=False,
            shapes=("odd", "one"),
            mode="eval",
        )
    assert ref.module.batch_size == 6
