"""The float64 reference: kept on the GPU where the plan leaves room for it, run in slices of the batch where only
its peak does not fit (and only where rows are proved apart), and repeated on the host where the GPU runs out."""

import pytest
import torch

from kp.judge import driver as judge
from kp.judge import expected, plan
from cases import CASES_DIR


def test_float64_reference_on_the_gpu_whenever_it_fits():
    """The softmax problem (6 GiB in, 6 GiB out, a forward peak of 12 GiB) keeps its float64 reference on an 80 GB
    GPU that is free, and sends it to the host when other processes leave too little; the reason says both sides."""
    fp = {"inputs": 6 << 30, "outputs": 6 << 30, "weights": 0, "flops": 0, "peak": 12 << 30}
    on, why = plan.float64_on_gpu(fp, 1, 79 << 30)
    assert on and "63.6 GiB needed" in why and "27.6 GiB" in why and "79.0 GiB free" in why
    on, why = plan.float64_on_gpu(fp, 1, 50 << 30)
    assert not on and "50.0 GiB free" in why


def test_float64_reference_in_slices_of_the_batch_where_its_peak_does_not_fit():
    """Where the float64 forward's whole peak does not fit beside the plan, it runs on the GPU in the fewest slices
    of the batch that do (its whole float64 output held); none where no slicing fits or there is no batch."""
    fp = {"inputs": 6 << 30, "outputs": 6 << 30, "weights": 0, "flops": 0, "peak": 24 << 30, "rows": 4096}
    assert not plan.float64_on_gpu(fp, 1, 79 << 30)[0]  # 36 GiB planned + 2.3 x 24 GiB of float64 peak
    n = plan.float64_chunks(fp, 1, 79 << 30)  # 36 GiB planned + 12 GiB of float64 output + 55.2 GiB / n
    assert n == 2
    assert plan.float64_chunks(fp, 1, 52 << 30) == 16 and plan.float64_chunks(fp, 1, 48 << 30) == 0
    assert (
        plan.float64_chunks({**fp, "rows": 1}, 1, 79 << 30) == 0
        and plan.float64_chunks({**fp, "rows": 0}, 1, 79 << 30) == 0
    )


def _ref_file(tmp_path, name: str, body: str, inputs: str = "torch.randn(64, 33)", init: str = "[]"):
    (tmp_path / f"{name}.py").write_text(
        f"import torch\nimport torch.nn as nn\n\n\n{body}\n\n\ndef get_inputs():\n    return [{inputs}]\n\n\n"
        f"def get_init_inputs():\n    return {init}\n"
    )
    return judge.Reference.load(("file", str(tmp_path / f"{name}.py")))


@pytest.mark.parametrize(
    "name,body,sliced",
    [
        (
            "rows",
            "class Model(nn.Module):\n    def forward(self, x):\n        return torch.softmax(x * 3, dim=1), x.sum(1)",
            None,
        ),
        (
            "mixes",
            "class Model(nn.Module):\n    def forward(self, x):\n        return x - x.mean(0)",
            "gives other rows on a slice",
        ),
        (
            "state",
            "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        self.bn = nn.BatchNorm1d(33)\n\n    def forward(self, x):\n        return self.bn(x)",
            "holds buffers",
        ),
        (
            "scalar",
            "class Model(nn.Module):\n    def forward(self, x):\n        return x.sum()",
            "not rows of one batch",
        ),
        (
            "square",
            "class Model(nn.Module):\n    def forward(self, a, b):\n        return a @ b",
            "raised RuntimeError on a slice",
        ),
    ],
)
def test_float64_reference_in_slices_only_where_rows_are_apart(tmp_path, name, body, sliced):
    """A sliced float64 forward gives the whole one's output; a forward that mixes rows, holds state, returns
    something other than rows or takes a matrix that is not a batch is proved unsliceable on its first call and runs
    whole on the host, said."""
    ref = _ref_file(
        tmp_path, name, body, "torch.randn(64, 64), torch.randn(64, 64)" if name == "square" else "torch.randn(64, 33)"
    )
    x = ref.inputs(3, "cpu")
    whole = expected._Refs(ref, ref.init(), 0, "cpu", "cpu").expected(x, "fp32")
    refs = expected._Refs(ref, ref.init(), 0, "cpu", "cpu", chunks=4)
    got = refs.expected(x, "fp32")
    assert [torch.equal(a, b) for a, b in zip(got.r64, whole.r64)] == [True] * len(whole.r64)
    if sliced is None:
        assert refs.chunk_proof == "in 4 slices of the batch" and refs.chunks == 4 and refs.moved is None
    else:
        assert sliced in refs.chunk_proof and refs.chunks == 1 and "cannot be sliced" in refs.moved


def test_float64_reference_falls_back_to_the_host_when_the_gpu_runs_out(monkeypatch):
    """A float64 forward that runs out of GPU memory is repeated on the host and the record's note says so; a
    reference already on the host passes the error on (the judge's own one-line out-of-memory verdict)."""
    ref = judge.Reference.load(("file", str(CASES_DIR / "layernorm" / "ref.py")))
    refs = expected._Refs(ref, ref.init(), 0, "cpu", "cpu")
    x = ref.inputs(1, "cpu")
    want = refs.expected(x, "fp32").r64[0]
    refs.f64_device = "gpu that ran out"  # as if the plan had put it on the GPU
    real, tries = expected._Refs._float64_try, []

    def short_of_memory(self, pristine, device):
        tries.append(device)
        if device != "cpu":
            raise torch.OutOfMemoryError("CUDA out of memory")
        return real(self, pristine, device)

    as64 = expected.as_float64
    monkeypatch.setattr(expected, "as_float64", lambda xs, device: as64(xs, "cpu"))  # no such device to copy to
    monkeypatch.setattr(expected._Refs, "_float64_try", short_of_memory)
    got = refs.expected(x, "fp32").r64[0]
    assert tries == ["gpu that ran out", "cpu"] and refs.f64_device == "cpu" and "ran out of memory" in refs.moved
    refs.to_host("again")  # already there: a second move keeps the reference where it is and records its reason
    assert refs.f64_device == "cpu" and refs.moved == "again"
    monkeypatch.setattr(
        expected._Refs, "_float64_try", lambda self, xs, device: (_ for _ in ()).throw(torch.OutOfMemoryError("host"))
    )
    with pytest.raises(torch.OutOfMemoryError):
        refs.expected(x, "fp32")
    assert torch.equal(got, want)
