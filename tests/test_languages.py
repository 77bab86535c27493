"""Kernels in the languages a candidate compiles at run time (kp.worker.languages), and inputs moved to new addresses
at parity (kp.judge.calls): what needs no GPU. The GPU judge cases (tests/judge_cases/contract/triton, cupy,
stale_graph) judge them end to end."""

import os
import sys
import types

import pytest
import torch

from conftest import ROOT
from kp.worker import languages
from kp.judge.calls import candidate_inputs, in_retired_buffers, moved_call

TRITON_CASES = ROOT / "tests" / "judge_cases" / "contract" / "triton"


def test_gpu_languages_read_from_the_imports_alone(tmp_path):
    f = tmp_path / "c.py"
    f.write_text("import torch\nimport triton.language as tl\nfrom cupy import RawKernel\n# numba is not imported\n")
    assert languages.gpu_languages(f) == [languages.TRITON, languages.CUPY]
    f.write_text("import torch\n'''mentions triton and cupy in a string only'''\n")
    assert languages.gpu_languages(f) == []
    assert languages.gpu_languages(tmp_path / "missing.py") == []


def test_a_file_under_the_candidates_folder_is_its_own_and_generated_code_is_torch_compiles(tmp_path, monkeypatch):
    inductor = tmp_path / "inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(inductor))
    o = languages.Origins(str(tmp_path))
    assert o.of(str(tmp_path / "cand.py")) == "own"
    assert o.of(str(tmp_path / "helpers" / "kernels.py")) == "own"
    assert o.of(str(inductor / "ab" / "cabc.py")) == "torch.compile's"  # under the candidate's folder, still not its
    assert o.of(torch.__file__) == "PyTorch's"
    assert o.of(os.__file__) == "Python's"
    libs = (str(tmp_path / "lib" / "site-packages") + os.sep, str(tmp_path / "lib") + os.sep)
    site = tmp_path / "lib" / "site-packages"
    assert languages.package_of(str(site / "liger_kernel" / "ops" / "rms_norm.py"), libs, libs[1]) == "liger_kernel's"
    assert languages.package_of(str(site / "six.py"), libs, libs[1]) == "six's"
    assert languages.package_of(str(tmp_path / "lib" / "os.py"), libs, libs[1]) == "Python's"
    assert languages.package_of("/elsewhere/x.py", libs, libs[1]) == "a library's"


def test_a_librarys_jit_kernels_are_named_by_its_package_and_make_a_row_no_pure_pytorch_one():
    """With --allow-torch and no kernel of its own, a row whose profiled kernels include an installed library's
    Triton kernels is labelled by them (the verdict's note, the table), not as pure PyTorch; PyTorch's and
    torch.compile's own JIT kernels are no library's."""
    from kp.observe import verdict

    foreign = {"_rms_norm_forward_kernel": "liger_kernel's Triton", "triton_poi_fused_0": "torch.compile's Triton"}
    ran = ["_rms_norm_forward_kernel", "triton_poi_fused_0", "void at::native::vectorized_elementwise_kernel<4>()"]
    assert languages.library_kernels(ran, foreign) == ["_rms_norm_forward_kernel (liger_kernel's Triton)"]
    assert languages.library_kernels(ran[1:], foreign) == []
    rec = {
        "rows": {
            "candidate": {
                "accepted": True,
                "reason": "",
                "pure_torch": False,
                "own_kernels": None,
                "library_kernels": ["_rms_norm_forward_kernel (liger_kernel's Triton)"],
            }
        }
    }
    said = verdict.verdict(rec)
    assert said.startswith(
        "accepted (a library's kernels: _rms_norm_forward_kernel (liger_kernel's Triton); no "
        "kernel of its own ran (--allow-torch)"
    ), said
    assert "pure PyTorch" not in said


def test_a_rejection_for_no_kernel_of_its_own_names_the_librarys_kernels_that_ran():
    """Without --allow-torch a row whose kernels were an installed library's is told so, by package, and that
    --allow-torch judges such a rewrite; a row of PyTorch's kernels alone is told the kernels it ran."""
    from kp.judge.escape import no_own_kernel

    foreign = {"_rms_norm_forward_kernel": "liger_kernel's Triton", "triton_poi_fused_0": "torch.compile's Triton"}
    lib = no_own_kernel(["_rms_norm_forward_kernel", "void at::native::vectorized_elementwise_kernel<4>()"], foreign)
    assert lib.startswith("own kernel: no kernel of the row's own ran; a library's kernels did ")
    assert "_rms_norm_forward_kernel (liger_kernel's Triton)" in lib and "over a library's kernels" in lib
    plain = no_own_kernel(["triton_poi_fused_0"], foreign)
    assert plain == (
        "own kernel: no kernel of the row's own ran (kernels seen: triton_poi_fused_0 (torch.compile's Triton)); "
        "--allow-torch judges a pure-PyTorch rewrite"
    )


def test_profiled_names_matched_to_the_kernels_they_run():
    table = {"_softmax_rows": "Triton", "scaled_relu": "CuPy", "add_kernel": "Numba CUDA"}
    assert languages.match("_softmax_rows", table) == "_softmax_rows"
    assert languages.match("scaled_relu", table) == "scaled_relu"
    assert languages.match("void scaled_relu<float>(float const*, float*, long long)", table) == "scaled_relu"
    assert (
        languages.match(
            "cudapy::kp_candidate::add_kernel[abi:v1,cw51cXTLSUwv1sCUt9Uw1VEw0NRRQPKzLTg4gaGKFsG2oMQGE"
            "Yak](Array<float, 1, C, mutable, aligned>)",
            table,
        )
        == "add_kernel"
    )
    # a library's kernel whose base name is a JIT kernel's: a C++ kernel runs under its signature, a JIT one does not
    assert (
        languages.match(
            "void at::native::softmax_warp_forward<float, float, float, 10>(float*)", {"softmax_warp_forward": "Triton"}
        )
        == "softmax_warp_forward"
    )
    assert languages.match("cunn_SoftMaxForward", table) is None
    assert languages.label_foreign(
        ["triton_per_fused__softmax_0", "gemm"], {"triton_per_fused__softmax_0": "torch.compile's Triton"}
    ) == ["triton_per_fused__softmax_0 (torch.compile's Triton)", "gemm"]


def test_kernel_objects_found_where_the_candidate_holds_them_not_where_a_library_does():
    class RawKernel:  # a stand-in with CuPy's shape
        def __init__(self, name):
            self.name = name

    held = RawKernel("mine")
    in_closure = RawKernel("closure")
    library = RawKernel("cupy_maximum")

    def forward(x, k=None):
        return in_closure

    model = types.SimpleNamespace(kernel=held, fn=forward, lib=types.ModuleType("cupy_like"))
    model.lib.kernel = library  # only through a module: not the candidate's
    found = languages._reachable([{"model": model}], (RawKernel,))
    assert {k.name for k in found} == {"mine", "closure"}


def test_a_triton_compile_error_is_one_line_with_the_compilers_message():
    CompilationError = type("CompilationError", (Exception,), {"__module__": "triton.compiler.errors"})
    inner = CompilationError("at 10:12:\n    break\n    ^\nunsupported AST node type: Break")
    inner.node, inner.src, inner.error_message = (
        types.SimpleNamespace(lineno=10),
        "def k():\n",
        "unsupported AST node type: Break",
    )
    outer = CompilationError("at 3:4:\n(an excerpt of the caller)")
    outer.node, outer.src, outer.error_message = types.SimpleNamespace(lineno=3), "def caller():\n", None
    outer.__cause__ = inner
    text = languages.jit_error(outer)
    assert text.startswith("Triton compile error") and text.endswith("unsupported AST node type: Break"), text
    assert "\n" not in text
    assert languages.jit_error(ValueError("plain")) is None


def test_triton_compile_time_is_not_wrapped_where_the_file_does_not_use_triton(tmp_path):
    f = tmp_path / "c.py"
    f.write_text("import torch\n")
    seconds = [0.0]
    languages.watch_jit_builds(f, seconds)  # imports nothing: the candidate writes no Triton
    assert "triton" not in sys.modules or seconds == [0.0]


class _Calls:
    """The part of a judge's run the candidate's input buffers live in."""

    def __init__(self):
        self.input_buffers, self.retired_buffers = {}, {}


def test_every_other_call_from_the_third_gets_inputs_at_new_addresses():
    assert [moved_call(i) for i in range(7)] == [False, False, True, False, True, False, True]
    c = _Calls()
    x1, x2, x3 = (torch.full((4, 3), v) for v in (1.0, 2.0, 3.0))
    a = candidate_inputs(c, [x1, 7])
    b = candidate_inputs(c, [x2, 7])  # refilled: the address it has seen, new values
    assert b[0].data_ptr() == a[0].data_ptr() and torch.equal(b[0], x2) and b[1] == 7
    m = candidate_inputs(c, [x3, 7], moved=True)  # moved: a new address, the old buffer alive and unchanged
    assert m[0].data_ptr() != a[0].data_ptr() and torch.equal(m[0], x3)
    old = in_retired_buffers(c, [x3, 7])  # the diagnosis: this call's values where the call before had its inputs
    assert old[0].data_ptr() == a[0].data_ptr() and torch.equal(old[0], x3)
    candidate_inputs(c, [x1, 7])  # the next refill lets the old buffer go
    assert in_retired_buffers(c, [x1, 7]) is None


def test_a_triton_candidate_on_the_cpu_gets_no_verdict(cli, tmp_path):
    r = cli(
        "--ref",
        TRITON_CASES / "ref.py",
        "--candidate",
        TRITON_CASES / "softmax_rows.py",
        "--device",
        "cpu",
        "--no-sandbox",
    )
    assert r.returncode == 2, r.stdout + r.stderr
    last = (r.stdout + r.stderr).strip().splitlines()[-1]
    assert "Triton" in last and "judge it on a GPU" in last, last


@pytest.mark.skipif(torch.cuda.is_available(), reason="a host with CUDA runs what the candidate asks for")
def test_a_candidate_that_asks_for_cuda_on_a_cpu_host_gets_no_verdict(cli, tmp_path):
    """A KernelBench candidate that moves its work to "cuda" by hand has no defect the CPU can name: torch here has
    no CUDA. No verdict (exit 2), said so, as a Triton candidate's; one that raises of its own is still rejected."""
    relu = ROOT / "tests" / "judge_cases" / "relu"
    cand = tmp_path / "cuda_by_hand.py"
    cand.write_text(
        "import torch\n\n\nclass ModelNew(torch.nn.Module):\n"
        '    def forward(self, x):\n        return torch.relu(x.to("cuda")).cpu()\n'
    )
    r = cli("--ref", relu / "ref.py", "--candidate", cand, "--device", "cpu", "--allow-torch")
    assert r.returncode == 2, r.stdout + r.stderr
    last = (r.stdout + r.stderr).strip().splitlines()[-1]
    assert "asks for CUDA, which this host does not have" in last and "judge it on a GPU" in last, last
    assert "rejected at" not in r.stdout + r.stderr  # the judge's log says no verdict as the verdict does
    cand.write_text(
        "import torch\n\n\nclass ModelNew(torch.nn.Module):\n"
        '    def forward(self, x):\n        raise AssertionError("not compiled with CUDA")\n'
    )
    r = cli("--ref", relu / "ref.py", "--candidate", cand, "--device", "cpu", "--allow-torch")
    assert r.returncode == 1 and "raised AssertionError" in r.stdout.strip().splitlines()[-1], r.stdout + r.stderr


@pytest.mark.parametrize("name", [p.name for p in TRITON_CASES.glob("*.py") if p.name != "ref.py"])
def test_every_triton_case_declares_it_needs_triton(name):
    from cases import meta

    assert "triton" in meta(TRITON_CASES / name)["NEEDS"]


def test_the_search_passes_by_dead_weak_proxies_and_objects_that_raise():
    import gc
    import weakref

    class K:
        pass

    class Raises:
        def __getattribute__(self, name):
            raise RuntimeError("asked")

    gone = K()
    proxy = weakref.proxy(gone)
    del gone
    gc.collect()
    live = K()
    assert languages._reachable([{"p": proxy, "r": Raises(), "k": live}], (K,)) == [live]
    assert live in languages._instances((K,))


def test_a_candidates_triton_cache_is_verified_when_lent_and_carried_to_its_next_version(tmp_path, monkeypatch):
    """Put back after a box: each file's sha256 recorded. Lent again: a file changed or added since is removed from
    the box's copy (Triton compiles it again). A new version of the same file starts with its last version's
    cache; another file never does."""
    from kp.box import builds

    monkeypatch.setenv("KP_CACHE_DIR", str(tmp_path / "cache"))
    cand = tmp_path / "cand.py"
    cand.write_text("v1\n")
    home = builds.candidate_build_dir(cand)
    (home / builds.JIT_CACHE / "k1").mkdir(parents=True)
    (home / builds.JIT_CACHE / "k1" / "kern.cubin").write_bytes(b"cubin")
    builds.seal_jit_cache(home)
    lent = tmp_path / "box"
    builds.copy_builds(home, lent)
    (lent / builds.JIT_CACHE / "k1" / "kern.cubin").write_bytes(b"tampered")
    (lent / builds.JIT_CACHE / "k1" / "extra.json").write_text("{}")
    assert builds.verify_jit_cache(home, lent) == 2 and not any((lent / builds.JIT_CACHE).rglob("*.*"))
    cand.write_text("v2\n")  # the loop's next version
    home2 = builds.candidate_build_dir(cand)
    assert home2 != home and (home2 / builds.JIT_CACHE / "k1" / "kern.cubin").read_bytes() == b"cubin"
    other = tmp_path / "other.py"
    other.write_text("another file\n")  # another file's first version: nothing of cand's
    assert not (builds.candidate_build_dir(other) / builds.JIT_CACHE).exists()
