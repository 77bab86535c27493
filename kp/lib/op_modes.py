"""The dispatch modes the judge runs a reference under, eagerly (never under torch.compile): its FLOPs by torch's
own formulas, the length of the reductions its operators make (what an honest kernel summing in another order
rounds like), and its operators' results rounded at random as an honest fp32 kernel may round them."""

from __future__ import annotations

import torch
import torch.utils._python_dispatch

from kp.lib.numerics import ACCUMULATION_FACTOR, FP32_UNIT_ROUNDOFF


def reduction_length(flops: float, in_numel: int, out_numel: int) -> float:
    """K, the terms summed per output element: FLOPs per output over two (GEMM, conv), or inputs per output (a
    reduction such as sum over a dimension), whichever is larger; 1 for elementwise work."""
    if out_numel <= 0:
        return 1.0
    return max(1.0, flops / (2.0 * out_numel), in_numel / out_numel)


# Operators that sum their input's terms into each output element, so an honest kernel summing in another order
# rounds like a reduction of length numel(in) / numel(out). Max, min and their arg variants round nothing.
_SUMMING = frozenset(
    """sum mean nansum var std var_mean std_mean norm linalg_vector_norm linalg_norm frobenius_norm
    logsumexp prod avg_pool1d avg_pool2d avg_pool3d adaptive_avg_pool1d _adaptive_avg_pool2d _adaptive_avg_pool3d
    mse_loss l1_loss smooth_l1_loss huber_loss kl_div binary_cross_entropy binary_cross_entropy_with_logits
    nll_loss_forward nll_loss2d_forward soft_margin_loss cosine_similarity _cdist_forward dot vdot trace""".split()
)
# Operators whose every output element depends on a sum along one dimension, with the input's shape kept.
_ALONG_DIM = frozenset("_softmax _log_softmax cumsum cumprod logcumsumexp _logcumsumexp".split())
# Their backwards, (grad_output, output, dim, input_dtype): each element depends on a sum along dim of the upstream
# gradient (times the output, for the softmax's).
_ALONG_DIM_BACKWARD = frozenset("_softmax_backward_data _log_softmax_backward_data".split())


# Products: the operand whose last dimension is summed, by its place among the arguments (mm(a, b), addmm(bias, a,
# b)); a convolution sums its weight's input channels times its kernel's elements.
_PRODUCTS = {"mm": 0, "bmm": 0, "addmm": 1, "baddbmm": 1, "addbmm": 1, "addmv": 1, "mv": 0}
_CONVOLUTIONS = frozenset("convolution _convolution convolution_overrideable cudnn_convolution".split())


def _op_reduction(func, args, kwargs, out) -> float:
    name = func.overloadpacket.__name__
    x = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if x is None or x.numel() == 0:
        return 1.0
    if name in _PRODUCTS:
        a = args[_PRODUCTS[name]]
        return float(a.shape[-1]) if isinstance(a, torch.Tensor) and a.dim() else 1.0
    if name in _CONVOLUTIONS and len(args) > 1 and isinstance(args[1], torch.Tensor) and args[1].dim() > 2:
        w, groups = args[1], args[8] if len(args) > 8 else 1
        transposed = bool(args[6]) if len(args) > 6 else False
        per_out = (w.shape[0] // max(int(groups), 1)) if transposed else w.shape[1]
        return float(per_out * w[0, 0].numel())
    if name in _ALONG_DIM:
        dim = args[1] if len(args) > 1 else kwargs.get("dim", -1)
        return float(x.shape[dim]) if x.dim() else 1.0
    if name in _ALONG_DIM_BACKWARD:
        dim = args[2] if len(args) > 2 else kwargs.get("dim", -1)
        return float(x.shape[dim]) if x.dim() else 1.0
    if name == "native_layer_norm":
        n = 1
        for d in args[1]:
            n *= int(d)
        return float(n)
    if name == "native_group_norm":  # (input, weight, bias, N, C, HxW, group, eps)
        return float(int(args[4]) // max(int(args[6]), 1) * int(args[5]))
    if "batch_norm" in name:  # statistics over every element of a channel, unless it normalises with stored ones
        if "no_update" in name or "no_training" in name or x.dim() < 2:
            return 1.0
        for a, v in zip(func._schema.arguments, args):
            if a.name == "training" and not v:
                return 1.0
        return x.numel() / max(x.shape[1], 1)
    if name in _SUMMING:
        o = out[0] if isinstance(out, (tuple, list)) else out
        if isinstance(o, torch.Tensor) and 0 < o.numel() < x.numel():
            return x.numel() / o.numel()
    return 1.0


class EagerMode(torch.utils._python_dispatch.TorchDispatchMode):
    """A dispatch mode the judge runs eagerly, never under torch.compile: its __torch_dispatch__ is not wrapped to
    keep Dynamo out, which imports torch._dynamo (and sympy) at the first operator, about 2 s of a small job."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False


class FlopCount(EagerMode):
    """The FLOPs of a forward by torch's own formulas (torch.utils.flop_counter's registry, what FlopCounterMode
    counts with, an operator it has no formula for decomposed as it does), counted by an EagerMode."""

    def __init__(self):
        super().__init__()
        from torch.utils.flop_counter import flop_registry

        self.registry, self.counts = flop_registry, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in self.registry and func is not torch.ops.prim.device.default:
            with self:
                r = func.decompose(*args, **kwargs)
            if r is not NotImplemented:
                return r
        out = func(*args, **kwargs)
        packet = func._overloadpacket
        if packet in self.registry:
            self.counts[packet] = self.counts.get(packet, 0) + self.registry[packet](*args, **kwargs, out_val=out)
        return out

    def get_total_flops(self) -> int:
        return sum(self.counts.values())

    def get_flop_counts(self) -> dict:
        """As FlopCounterMode's: {module: {operator: FLOPs}}, the whole forward as one module."""
        return {"Global": dict(self.counts)}


class ReductionLength(EagerMode):
    """The longest reduction any operator of a forward performs, K of the budget's floor: a softmax, a norm or a
    prefix sum keeps its input's shape, so the model's own input and output sizes do not show it."""

    def __init__(self):
        super().__init__()
        self.k = 1.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        try:
            self.k = max(self.k, _op_reduction(func, args, kwargs, out))
        except Exception:  # an operator this cannot read adds nothing to K: the floor only widens the budget
            pass
        return out


class RoundingNoise(EagerMode):
    """Monte Carlo arithmetic over a float64 forward: every fresh floating result of every operator times
    (1 + delta xi), delta the budget's floor for that operator's own reduction length (2 u sqrt(K) of fp32; K = 1 for
    an elementwise one), xi a normal draw of a fixed generator. How far a model's outputs move over a few such runs
    is how far an honest fp32 kernel's roundings may move them, cancellation after a long sum included (the
    difference of two distances near 90). Views and in-place results are left alone (they alias their inputs)."""

    def __init__(self, seed: int):
        super().__init__()
        self.seed, self.gens = seed, {}  # one generator per device: draws made where the results are

    def _gen(self, device: torch.device) -> torch.Generator:
        if device not in self.gens:
            self.gens[device] = torch.Generator(device=device).manual_seed(self.seed)
        return self.gens[device]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket.__name__ in _ALONG_DIM_BACKWARD and len(args) > 2 and not kwargs:
            return self._backward_along_dim(func.overloadpacket.__name__, *args[:3])
        return self._noisy(func, args, kwargs)

    def _backward_along_dim(self, name: str, grad, out, dim):
        """A softmax's or log-softmax's backward as the steps an honest kernel rounds (the product, the sum along
        dim, the difference), each rounded at random: the difference cancels where a row's output is nearly one-hot
        (grad - sum(grad * out) with sum ~ grad at the peak), and that cancellation moves the row as a kernel's own
        roundings do; rounding only the fused operator's result would not show it."""
        aten = torch.ops.aten
        if name == "_softmax_backward_data":
            s = self._noisy(aten.sum.dim_IntList, (self._noisy(aten.mul.Tensor, (grad, out), {}), [dim], True), {})
            return self._noisy(aten.mul.Tensor, (out, self._noisy(aten.sub.Tensor, (grad, s), {})), {})
        s = self._noisy(aten.sum.dim_IntList, (grad, [dim], True), {})
        return self._noisy(
            aten.sub.Tensor,
            (grad, self._noisy(aten.mul.Tensor, (self._noisy(aten.exp.default, (out,), {}), s), {})),
            {},
        )

    def _noisy(self, func, args, kwargs):
        out = func(*args, **kwargs)
        schema = func._schema
        if schema.is_mutable or any(r.alias_info is not None for r in schema.returns):
            return out
        try:
            k = _op_reduction(func, args, kwargs, out)
        except Exception:
            k = 1.0
        delta = ACCUMULATION_FACTOR * FP32_UNIT_ROUNDOFF * max(k, 1.0) ** 0.5

        def noisy(t):
            if not (isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()):
                return t
            xi = torch.randn(t.shape, generator=self._gen(t.device), dtype=t.dtype, device=t.device)
            return t * (1 + delta * xi)

        return type(out)(noisy(t) for t in out) if isinstance(out, (tuple, list)) else noisy(out)


# Products and their multiplicands, by place among the arguments (addmm(bias, a, b): a and b; the bias is added in
# fp32): what a TF32 tensor core reads at TF32's 10-bit mantissa.
_MULTIPLICANDS = {
    "mm": (0, 1),
    "bmm": (0, 1),
    "addmm": (1, 2),
    "baddbmm": (1, 2),
    "addbmm": (1, 2),
    "addmv": (1, 2),
    "mv": (0, 1),
    "convolution": (0, 1),
    "_convolution": (0, 1),
    "convolution_overrideable": (0, 1),
    "cudnn_convolution": (0, 1),
}
TF32_DROPPED_BITS = 13  # fp32's 23 mantissa bits less TF32's 10


def tf32_truncated(t: torch.Tensor) -> torch.Tensor:
    """A float32 tensor's values with the low 13 bits of every mantissa cleared: what a TF32 tensor core reads from
    fp32 operands it is handed as they are (Triton's tl.dot with its default input_precision="tf32"). cuBLAS's TF32
    path rounds to nearest instead, which errs about half as much."""
    return (t.view(torch.int32) & -(1 << TF32_DROPPED_BITS)).view(torch.float32)


class TruncatedTF32(EagerMode):
    """An fp32 forward whose products (GEMMs, matrix-vector products, convolutions) read their float32 multiplicands
    truncated to TF32 and multiply them exactly, accumulating in fp32: the arithmetic of TF32 tensor cores fed raw
    fp32 inputs. Run with TF32 off (kp.lib.layers.set_precision("fp32")), so that the products of the truncated
    values are exact. `hit`: whether any product ran."""

    def __init__(self):
        super().__init__()
        self.hit = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        places = _MULTIPLICANDS.get(func.overloadpacket.__name__)
        if places:
            args = list(args)
            for i in places:
                if i < len(args) and isinstance(args[i], torch.Tensor) and args[i].dtype == torch.float32:
                    args[i] = tf32_truncated(args[i])
                    self.hit = True
        return func(*args, **kwargs)
