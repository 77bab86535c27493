"""torch's header precompiled for candidates' builds (kp.box.pch): which flags get a variant, where a build finds
it, and that a main.cpp compiled with torch's own flags takes it."""

import os
import shlex
import subprocess

import pytest

from kp.box import pch


@pytest.fixture
def on(tmp_path, monkeypatch):
    monkeypatch.setenv("KP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("KP_PCH", "1")
    return tmp_path


def test_literal_extra_cflags_make_variants_and_flags_the_judge_would_not_run_do_not(on):
    a, b, c = on / "a.py", on / "b.py", on / "c.py"
    a.write_text("load_inline('x', '', extra_cflags=['-O3'])\nload_inline('y', '', extra_cflags=[''])\n")
    b.write_text(
        "load_inline('x', '', extra_cflags=['-O3'], extra_cuda_cflags=['-O3'])\n"
        "load_inline('z', '', extra_cflags=['-O2', '-fplugin=/tmp/evil.so'])\n"
    )
    c.write_text("flags = ['-O1']\nload_inline('x', '', extra_cflags=flags)\nload_inline(extra_cflags='-Wall')\n")
    assert pch.literal_cflags(a) == [["-O3"], []]
    assert pch.literal_cflags(b) == [["-O3"]]  # the plugin is not a flag the judge runs the compiler with
    assert pch.literal_cflags(c) == [["-Wall"]]  # a name is not a literal
    assert pch.variants([a, b, c]) == [[], ["-O3"], ["-Wall"]]
    assert "not built" in pch.build(["-O2", "-fplugin=/tmp/evil.so"])


def test_the_folder_a_build_searches_is_the_same_before_and_after_its_variants_exist(on, monkeypatch):
    before = pch.env({"CPATH": "/usr/include/extra"})
    assert before["CPATH"] == f"{pch.root()}{os.pathsep}/usr/include/extra"
    pch.variant_dir().mkdir(parents=True)
    assert pch.env({}) == {"CPATH": str(pch.root())}
    monkeypatch.setenv("KP_PCH", "0")
    assert pch.env({"A": "1"}) == {"A": "1"} and pch.start([[]]) is None


def test_a_box_plan_searches_the_variants_folder(on):
    from kp.box.start import _plan

    env = _plan(("file", __file__), [], True)[2]
    assert env["CPATH"].split(os.pathsep)[0] == str(pch.root())


def test_a_main_cpp_compiled_with_torchs_own_flags_takes_the_precompiled_header(on):
    """The default variant, built as a batch builds it, then a main.cpp as torch's ninja file compiles it (its
    extension's name defined, CPATH as a box gets it): GCC says (-H) it took the variant ('!'), not the header."""
    assert "built in" in pch.build([])
    cmd = pch.command([], os.devnull)
    at = cmd.index("-x")
    flags = cmd[at + 5 :]  # after: -x c++-header <header> -o <out>
    main = on / "main.cpp"
    main.write_text("#include <torch/extension.h>\nint twice(int x) { return 2 * x; }\n")
    r = subprocess.run(
        [*cmd[:at], "-DTORCH_EXTENSION_NAME=cand_1", *flags, "-H", "-Winvalid-pch", "-fsyntax-only", str(main)],
        capture_output=True,
        text=True,
        env=pch.env(dict(os.environ)),
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    took = [ln for ln in r.stderr.splitlines() if ln.startswith("! ")]
    assert took and took[0].startswith(f"! {pch.variant_dir()}/"), shlex.join(cmd) + "\n" + r.stderr[-2000:]
    assert "built in" not in pch.build([])  # there: not built again


def test_variants_of_other_installs_are_swept_but_the_newest(on):
    import time

    base = pch.root().parent
    for name, age_s in (("old", 300), ("older", 400), ("newer", 10)):
        (base / name / "torch").mkdir(parents=True)
        os.utime(base / name, (time.time() - age_s,) * 2)
    pch.variant_dir().mkdir(parents=True)
    gone = pch.sweep(keep=2)
    assert sorted(p.name for p in gone) == ["old", "older"]
    assert sorted(p.name for p in base.iterdir()) == sorted(["newer", pch.root().name])


def test_a_loops_first_candidate_that_builds_starts_the_variants(on, monkeypatch):
    from kp.batch import session

    started = []
    monkeypatch.setattr(pch, "start", lambda flag_sets: started.append(flag_sets))
    plain, builds = on / "plain.py", on / "builds.py"
    plain.write_text("class ModelNew: pass\n")
    builds.write_text("from torch.utils.cpp_extension import load_inline\nload_inline('e', '', extra_cflags=['-O3'])\n")
    session._precompile([plain])
    assert started == []
    session._precompile([plain, builds])
    assert started == [[[], ["-O3"]]]


def test_a_variant_that_failed_is_not_tried_again(on, monkeypatch):
    """A build that fails (here: torch's flags not to be had) is marked, and a loop's next call starts no builder."""

    def no_flags(flags, out):
        raise KeyError("cxx")

    monkeypatch.setattr(pch, "command", no_flags)
    assert pch.missing([[], ["-O3"]]) == [[], ["-O3"]]
    assert "not built (KeyError" in pch.build(["-O3"])
    assert pch.missing([[], ["-O3"]]) == [[]]
