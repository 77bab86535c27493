"""Cache key: source, included headers, flags each change it; nothing else does; it is stable across processes."""

import subprocess
import sys
import textwrap

import pytest

import harness
import kp.lib.build


@pytest.fixture
def tree(tmp_path, monkeypatch):
    k = tmp_path / "kernels"
    (k / "common").mkdir(parents=True)
    (k / "p").mkdir()
    (k / "common" / "kp.cuh").write_text("// common\n")
    (k / "p" / "local.cuh").write_text("// local v1\n")
    (k / "p" / "1_a.cu").write_text('#include "../common/kp.cuh"\n#include "local.cuh"\nKP_EXPORT void f() {}\n')
    (k / "p" / "2_b.cu").write_text('#include "../common/kp.cuh"\nKP_EXPORT void g() {}\n')
    monkeypatch.setattr(kp.lib.build, "KERNELS", k)
    monkeypatch.setattr(kp.lib.build, "ROOT", tmp_path)
    return k


def keys(k):
    return (harness.cache_key(k / "p" / "1_a.cu", (9, 0)), harness.cache_key(k / "p" / "2_b.cu", (9, 0)))


def test_local_headers_are_transitive(tree):
    (tree / "common" / "kp.cuh").write_text('#include "deeper.cuh"\n')
    (tree / "common" / "deeper.cuh").write_text("// deeper\n")
    names = [p.name for p in harness.local_headers(tree / "p" / "1_a.cu")]
    assert names == sorted(names) and set(names) == {"kp.cuh", "deeper.cuh", "local.cuh"}


def test_source_edit_changes_only_that_key(tree):
    a0, b0 = keys(tree)
    (tree / "p" / "1_a.cu").write_text((tree / "p" / "1_a.cu").read_text() + "// edit\n")
    a1, b1 = keys(tree)
    assert a1 != a0 and b1 == b0


def test_header_edit_changes_only_includers(tree):
    a0, b0 = keys(tree)
    (tree / "p" / "local.cuh").write_text("// local v2\n")
    a1, b1 = keys(tree)
    assert a1 != a0 and b1 == b0
    (tree / "common" / "kp.cuh").write_text("// common v2\n")
    a2, b2 = keys(tree)
    assert a2 != a1 and b2 != b1


def test_flags_arch_and_versions_change_key(tree, monkeypatch):
    a0, _ = keys(tree)
    assert harness.cache_key(tree / "p" / "1_a.cu", (8, 0)) != a0
    assert harness.cache_key(tree / "p" / "1_a.cu", (9, 0), experiments=True) != a0  # the bench scripts' build
    orig = harness.build_flags
    monkeypatch.setattr(
        kp.lib.build, "build_flags", lambda cap, exp=False: {**orig(cap), "cflags": orig(cap)["cflags"] + ["-g"]}
    )
    assert keys(tree)[0] != a0
    monkeypatch.setattr(kp.lib.build, "build_flags", orig)
    monkeypatch.setattr(kp.lib.build.torch, "__version__", "9.9.9")
    assert keys(tree)[0] != a0


def test_same_key_in_two_processes():
    code = textwrap.dedent("""
        import harness
        print(harness.cache_key(harness.KERNELS / "softmax" / "2_online.cu", (9, 0)))
    """)
    outs = {
        subprocess.run(
            [sys.executable, "-c", code], cwd=harness.ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        for _ in range(2)
    }
    assert len(outs) == 1 and len(outs.pop()) == 64


def test_exports_parse_and_reject_unsupported_types():
    ex = harness.parse_exports("KP_EXPORT void f(const at::TensorBase& x, int64_t n, double eps, bool t)\n{}")
    assert ex[0].name == "f" and [t for t, _ in ex[0].params] == ["const at::TensorBase&", "int64_t", "double", "bool"]
    with pytest.raises(harness.KernelBuildError, match="unsupported parameter"):
        harness.parse_exports("KP_EXPORT void f(float* p) {}")
    with pytest.raises(harness.KernelBuildError, match="no `KP_EXPORT"):
        harness.parse_exports("void f() {}")


def test_build_error_summary_names_file_and_line():
    log = (
        f"FAILED: cuda.cuda.o\n/usr/bin/nvcc ... -c cuda.cu\n"
        f'{harness.KERNELS}/softmax/2_online.cu(42): error: identifier "oops" is undefined\n'
        f'1 error detected in the compilation of "cuda.cu".\nninja: build stopped: subcommand failed.\n'
    )
    s = harness.summarize_build_error(log)
    assert s == 'kernels/softmax/2_online.cu:42: error: identifier "oops" is undefined'
    gcc = "main.cpp:7:3: error: 'x' was not declared in this scope\n"
    assert harness.summarize_build_error(gcc) == "main.cpp:7: error: 'x' was not declared in this scope"


# ---------------------------------------------------------------------------------------------------------------
# A cache entry is loaded only if its library is the one that was built: its sha256 is recorded when the finished
# build folder is moved into place, and checked at every load.


def _entry(tmp_path, data=b"\x7fELF" + b"x" * 5000):
    tmp = tmp_path / ".build-kp_m"
    tmp.mkdir()
    (tmp / "kp_m.so").write_bytes(data)
    bdir = tmp_path / "kp_m"
    kp.lib.build.publish_entry(tmp, bdir, "kp_m.so", "KEY")
    return bdir, bdir / "kp_m.so"


def test_published_entry_verifies(tmp_path):
    bdir, so = _entry(tmp_path)
    assert not (tmp_path / ".build-kp_m").exists()  # moved, not copied
    assert kp.lib.build.verify_entry(bdir, so, "KEY") == "ok"
    assert kp.lib.build.verify_entry(tmp_path / "none", so, "KEY") == "missing"
    assert kp.lib.build.verify_entry(bdir, so, "OTHER") == "belongs to another source"


@pytest.mark.parametrize(
    "damage, says",
    [
        (lambda so: so.write_bytes(b""), "truncated or altered"),
        (lambda so: so.write_bytes(so.read_bytes()[:100]), "truncated or altered"),
        (lambda so: so.write_bytes(so.read_bytes()[:-1] + b"y"), "does not match its checksum"),
        (lambda so: so.unlink(), "is missing its library"),
        (lambda so: (so.parent / "kp_complete").write_text("KEY"), "has no checksum"),
    ],
)
def test_damaged_entry_is_named_not_loaded(tmp_path, damage, says):
    bdir, so = _entry(tmp_path)
    damage(so)
    assert says in kp.lib.build.verify_entry(bdir, so, "KEY")


def test_republish_replaces_whole_entry(tmp_path):
    bdir, so = _entry(tmp_path)
    (bdir / "stale.o").write_text("old")
    tmp = tmp_path / ".build-kp_m"
    tmp.mkdir()
    (tmp / "kp_m.so").write_bytes(b"new library")
    kp.lib.build.publish_entry(tmp, bdir, "kp_m.so", "KEY")
    assert not (bdir / "stale.o").exists() and so.read_bytes() == b"new library"
    assert kp.lib.build.verify_entry(bdir, so, "KEY") == "ok"
    assert [p.name for p in tmp_path.iterdir()] == ["kp_m"]
