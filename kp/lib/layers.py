"""Helpers ModelNew classes share: weight-derived caches, IEEE fp32 GEMMs, input checks."""

from __future__ import annotations

import contextlib
import functools

import torch

from kp.lib.build import Kernel
from kp.lib.registry import FLOAT32_PRECISIONS
from kp.errors import UsageError

# ---------------------------------------------------------------------------------------------------------------
# Helpers ModelNew classes share: weight-derived caches, IEEE fp32 GEMMs, input checks.


class DerivedCache:
    """A value computed from some tensors (e.g. W^T or W.sum(0)), recomputed whenever any of them may have changed.

    The key is (data_ptr, version counter, dtype, device, shape, strides) of each tensor: in-place edits (including
    optimizer steps and load_state_dict, which copy into the parameter under no_grad) bump the version counter;
    .to()/.cuda() and replacing the Parameter change the storage. The tensors seen last are kept alive (`_pins`),
    so their addresses cannot be reused by a different tensor while the cached value is held. Not seen: writes
    through `.data` (a separate version counter) or raw pointers; call `invalidate()` after those.
    """

    def __init__(self, fn):
        self.fn = fn
        self.misses = 0
        self.invalidate()

    def invalidate(self) -> None:
        self._key, self._val, self._pins = None, None, None

    @staticmethod
    def _key_of(t):
        if t is None:
            return None
        return (t.data_ptr(), t._version, t.dtype, t.device, tuple(t.shape), tuple(t.stride()))

    def get(self, *tensors):
        """The cached value if it was computed from exactly these tensors in their current state, else None."""
        if self._val is not None and tuple(self._key_of(t) for t in tensors) == self._key:
            return self._val
        return None

    def put(self, val, *tensors):
        """Store a value computed from these tensors (a kernel may produce it as a by-product)."""
        self._key, self._val = tuple(self._key_of(t) for t in tensors), val
        self._pins = [None if t is None else t.detach() for t in tensors]
        self.misses += 1
        return val

    def __call__(self, *tensors):
        val = self.get(*tensors)
        if val is None:
            with torch.no_grad():
                val = self.put(self.fn(*tensors), *tensors)
        return val

    def __deepcopy__(self, memo):  # a copied module owns different tensors: start empty
        return DerivedCache(self.fn)


@contextlib.contextmanager
def ieee_fp32():
    """TF32 off for the enclosed GEMMs whatever the caller's global setting: fp32 mode means fp32 arithmetic."""
    prev = torch.backends.cuda.matmul.allow_tf32
    if not prev:  # the common case: nothing to change (setting it costs a few us per call)
        yield
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def check_input(x, name: str, features: int, dims: int = 2) -> None:
    """ValueError (not a crash, not a kernel-side error) for inputs a ModelNew cannot take."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != dims:
        raise ValueError(f"{name} must be {dims}-D, got shape {tuple(x.shape)}")
    if x.dtype != torch.float32:
        raise ValueError(f"{name} must be float32, got {x.dtype}")
    if not x.is_cuda:
        raise ValueError(f"{name} must be a CUDA tensor, got device {x.device}")
    if x.size(-1) != features:
        raise ValueError(f"{name} has {x.size(-1)} features, the module expects {features}")


def mm_fp32(x: torch.Tensor, wt: torch.Tensor) -> torch.Tensor:
    """x @ wt on cuBLAS in IEEE fp32 (TF32 off for this call only)."""
    with ieee_fp32():
        return torch.mm(x, wt)


GEMM_MODES = ("auto", "fp64", "fp32", "split", "split_wgmma", "triton")


@contextlib.contextmanager
def tf32_matmul():
    """TF32 on for the enclosed cuBLAS GEMMs (the opt-in reduced-precision mode), restored afterwards."""
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


class LinearGemm:
    """y = x @ W^T as float32 for the Linear problems.

    "split" (the default where the rung's .cu exports split_gemm, i.e. 2_split_wgmma): fp16 tensor cores, three
    products of the per-row power-of-two-scaled hi/lo split (kernels/common/split_gemm.cuh). W's split is a property
    of the weight: cached in a DerivedCache (recomputed after any in-place edit, optimizer step, load_state_dict,
    .to(), or a replaced Parameter); x is split per call. precision="tf32" keeps one product (TF32-like error),
    x_hi W_hi^T: a plain fp16 GEMM, which cuBLAS (fp16 in, fp32 accumulate and out: torch.mm's out_dtype) runs faster
    than the split kernel does with one product (H100, 1024x8192x8192: 0.178 ms; the split kernel ~0.29 ms), then
    the rung's split_unscale undoes the scales and recomputes flagged rows. "split_wgmma": the split kernel for the
    one product too (where torch.mm has no out_dtype, "split" falls back to it).
    "fp64": cuBLAS DGEMM on float64 copies (FP64 tensor cores on Hopper), rounded to fp32 once at the end. On the
    H200 (bench/matmul_sum_max_mean_lse/ab.py) the 1024x8192x8192 DGEMM took 2.185 ms against 2.660 ms for the fp32
    SIMT SGEMM, with relL2 2.5e-8 against 1.6e-6: faster and ~60x closer to the float64 reference. Costs: x converted
    per call (~25 us), y rounded (~25 us), W^T cached in float64 (2x the weight's memory).
    "fp32": cuBLAS SGEMM with TF32 off on W^T as a view: the same TN kernel, hence the same rounding, as the
    reference's F.linear. (A cached contiguous W^T made cuBLAS pick its NN kernel, 2% faster at the bench shape but
    rounding differently: on a small large-magnitude case its worst softmax row was 5.2x PyTorch's own error.)
    With precision="tf32" the cuBLAS modes run with TF32 on (what PyTorch's TF32 mode does).
    "triton": the peer (peers/triton_gemm.py), tl.dot tf32x3 with per-k-block promotion; "tf32" in the tf32 mode.
    "auto": "split" if the kernel exports split_gemm, else "fp64".
    """

    def __init__(self, mode: str = "auto", kernel: "Kernel | None" = None, precision: str = "fp32"):
        if mode not in GEMM_MODES:
            raise UsageError(f"gemm must be one of {', '.join(GEMM_MODES)}, got {mode!r}")
        if precision not in FLOAT32_PRECISIONS:  # an fp32 GEMM (a 16-bit problem's GEMM is cuBLAS's own)
            raise UsageError(f"LinearGemm computes fp32 (precision fp32 or tf32), got {precision!r}")
        has_split = kernel is not None and "split_gemm" in kernel.exports()
        if mode == "auto":  # the rung's own GEMM; cuBLAS: DGEMM at fp32 accuracy, TF32 in the tf32 mode
            mode = "split" if has_split else ("fp32" if precision == "tf32" else "fp64")
        if mode in ("split", "split_wgmma") and not has_split:
            raise UsageError(f"gemm={mode!r} needs a rung that exports split_gemm; {kernel!r} does not")
        self.mode, self.precision, self.k = mode, precision, kernel
        if mode == "fp64":
            self.wt = DerivedCache(lambda w: w.t().contiguous().double())
        elif mode in ("split", "split_wgmma"):
            self.wsplit = DerivedCache(self._split)
        # the one-product mode's GEMM on cuBLAS (only the tf32 precision ever takes one product)
        self.hgemm = mode == "split" and precision == "tf32" and "split_unscale" in kernel.exports() and _mm_out_dtype()

    def _split(self, t: torch.Tensor, with_lo: bool = True):
        r, k = t.shape
        kp = (k + 7) // 8 * 8
        hi = torch.empty(r, kp, dtype=torch.float16, device=t.device)
        lo = torch.empty_like(hi) if with_lo else hi.new_empty(0)  # one-product calls read hi only
        inv = torch.empty(r, dtype=torch.float32, device=t.device)
        flag = torch.empty(r, dtype=torch.uint8, device=t.device)
        self.k.split_rows(t, hi, lo, inv, flag)
        return hi, lo, inv, flag

    # tf32 mode keeps one product only from this many FLOPs on (1024x2048x2048 is 2^32). Below it the three-product
    # path costs microseconds and stays fp32-accurate, and cuBLAS often is not TF32 there either (on the H200 a
    # 3x70001x16 GEMM with TF32 on gave relL2 ~1e-7; one fp16 product gives ~6e-5: 4x PyTorch's own error is then
    # out of reach). More exact than asked is allowed; less is not.
    TF32_MIN_FLOPS = 1 << 32

    def nprod(self, m: int, n: int, k: int) -> int:
        return 1 if self.precision == "tf32" and 2 * m * n * k >= self.TF32_MIN_FLOPS else 3

    def __call__(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if self.mode in ("split", "split_wgmma"):
            n = self.nprod(x.size(0), w.size(0), x.size(1))
            xh, xl, xi, xf = self._split(x, n == 3)
            wh, wl, wi, wf = self.wsplit(w)  # W's split keeps lo: cached for either precision
            if n == 1 and self.hgemm:
                y = torch.mm(xh, wh.t(), out_dtype=torch.float32)
                self.k.split_unscale(xi, xf, wi, wf, x, w, y)
                return y
            y = torch.empty(x.size(0), w.size(0), dtype=torch.float32, device=x.device)
            self.k.split_gemm(xh, xl, xi, xf, wh, wl, wi, wf, x, w, y, n)
            return y
        if self.mode == "fp64":
            return torch.mm(x.double(), self.wt(w)).float()
        if self.mode == "triton":
            from peers import triton_gemm

            return triton_gemm.linear(x, w, self.precision)
        if self.precision == "tf32":
            with tf32_matmul():
                return torch.mm(x, w.t())
        return mm_fp32(x, w.t())


@functools.lru_cache(maxsize=None)
def _mm_out_dtype() -> bool:
    """Whether this torch's CUDA mm takes out_dtype (fp16 in, float32 out)."""
    try:
        a = torch.ones(8, 8, dtype=torch.float16, device="cuda")
        return torch.mm(a, a, out_dtype=torch.float32).dtype == torch.float32
    except Exception:  # TypeError (no out_dtype), RuntimeError / AssertionError (no CUDA, no kernel)
        return False


def set_precision(precision: str) -> None:
    """The process-wide TF32 switches for a judged precision (tf32: on, as PyTorch's own TF32 mode; fp32, bf16 and
    fp16: off, so what stays fp32 in a half-precision model is fp32)."""
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


# ---------------------------------------------------------------------------------------------------------------
# Training: a kernel's output given a backward.


class _Trained(torch.autograd.Function):
    @staticmethod
    def forward(ctx, kernel, reference, *tensors):
        ctx.reference = reference
        ctx.save_for_backward(*tensors)
        with torch.no_grad():
            return kernel(*tensors)

    @staticmethod
    def backward(ctx, *grads):
        tensors = ctx.saved_tensors
        wanted = [i for i, t in enumerate(tensors) if ctx.needs_input_grad[2 + i]]
        leaves = [
            t.detach().requires_grad_(i in wanted) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
            for i, t in enumerate(tensors)
        ]
        with torch.enable_grad():
            out = ctx.reference(*leaves)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
        got = (
            torch.autograd.grad(
                [o for o, _ in pairs], [leaves[i] for i in wanted], [g for _, g in pairs], allow_unused=True
            )
            if pairs and wanted
            else []
        )
        result = [None] * len(tensors)
        for i, g in zip(wanted, got):
            result[i] = g
        return (None, None, *result)


def trained(kernel, reference, *tensors):
    """kernel(*tensors), the forward as the playground's kernels compute it, with a backward: the gradients PyTorch's
    autograd takes through reference(*tensors), the same function written in PyTorch (pure: no buffer updated), run
    again in the backward. For a model whose own backward kernels would not pay (a GEMM's gradients are two more
    GEMMs, which cuBLAS runs); outside autograd (no_grad, or nothing requires grad) it is the kernel alone."""
    if not torch.is_grad_enabled() or not any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
        return kernel(*tensors)
    return _Trained.apply(kernel, reference, *tensors)
