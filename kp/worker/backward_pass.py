"""A judged call with its backward pass (`--backward`), in the candidate's worker: the forward run with autograd on,
its floating inputs made leaves that require grad, then one backward pass from the upstream gradients the judge drew
for this call, and the gradients every floating input and every trainable parameter received, sent back as copies
(kp.judge.backward judges them)."""

from __future__ import annotations

import torch

NO_GRAD_FN = (
    "its output has no grad_fn (computed under no_grad or detached, or by a kernel with no backward: "
    "wrap it in a torch.autograd.Function), so it cannot be trained"
)


class NotTrainable(RuntimeError):
    """A call whose output autograd cannot go back through."""


def _outputs(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def leaves(inputs: list) -> list:
    """The inputs as autograd leaves: each floating tensor detached (its storage shared) and requiring grad."""
    return [
        x.detach().requires_grad_(True) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs
    ]


def backward_pass(model, inputs: list, upstream: list, between=None):
    """The forward with autograd on and one backward from `upstream`, nothing waited for: (output, the inputs as
    leaves). What the escape check times (kp.worker.profiling), and what a parity call runs. between: called after the
    forward and before the backward (the escape check's marker between the two passes)."""
    xs = leaves(inputs)
    with torch.enable_grad():
        out = model(*xs)
    if between is not None:
        between()
    pairs = [
        (o, g)
        for o, g in zip(_outputs(out), upstream)
        if g is not None and isinstance(o, torch.Tensor) and o.is_floating_point()
    ]
    if not pairs or not all(o.requires_grad for o, _ in pairs):
        raise NotTrainable(NO_GRAD_FN)
    torch.autograd.backward([o for o, _ in pairs], [g.to(o.device, o.dtype) for o, g in pairs])
    return out, xs


def upstream_like(out) -> list:
    """An upstream gradient for each floating output (None for the rest): standard normal values."""
    return [
        torch.randn_like(o) if isinstance(o, torch.Tensor) and o.is_floating_point() else None for o in _outputs(out)
    ]


def call_with_backward(model, inputs: list, upstream: list, zero: bool):
    """(output, gradients) of one call: gradients = {"inputs": [grad or None per input], "params": {name: grad or
    None}} for every floating input and every parameter that requires grad. zero: the parameters' .grad cleared
    first (else this backward adds to what the call before left, as PyTorch's does)."""
    params = (
        {k: p for k, p in model.named_parameters() if p.requires_grad} if isinstance(model, torch.nn.Module) else {}
    )
    if zero:
        for p in params.values():
            p.grad = None
    out, xs = backward_pass(model, inputs, upstream)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()  # device-wide: a backward's side-stream work is finished before its grads leave
    grads = {
        "inputs": [x.grad.detach().clone() if isinstance(x, torch.Tensor) and x.grad is not None else None for x in xs],
        "params": {k: p.grad.detach().clone() if p.grad is not None else None for k, p in params.items()},
    }
    return out, grads
