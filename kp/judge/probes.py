"""The reference tested before it is trusted: outputs no kernel computes, judged as a candidate's are.

A reference whose outputs, at its benchmark shape, a constant matches within the budget (KernelBench's own tracker
counts four of sixty level-1 problems that returning zeros passes under its tolerance) rewards a search loop for a
shortcut. So at each benchmark-shape call of parity the judge also judges, in its own process and with the call's
own budgets (kp.judge.outputs.judge_output on the call's Expected), what a cheat would return:

- zeros, and a constant (each output's float64 mean),
- each input passed through, where it has an output's shape and dtype,
- the output of the call before (stale),
- the reference itself computed in bf16 and in fp16 (a copy of its model and its inputs cast): in fp32; in tf32
  bf16 alone (fp16 keeps TF32's 10-bit mantissa).

A probe is dropped at the first call that rejects it; one that every call passes is a hole in the reference: the
verdict and the record say so, once (`Probes.weak`). What it costs is the probes' comparisons and the two
low-precision forwards at the first call (the record's stage detail, "parity: the reference's probes").
"""

from __future__ import annotations

import copy

import torch

from kp.errors import Rejected, failed_figures, first_line
from kp.judge.outputs import Expected, judge_output
from kp.judge.release import release_cached
from kp.judge.reference import _as_list, describe

LOW_PRECISIONS = {"bf16": torch.bfloat16, "fp16": torch.float16}
STALE = "stale (the call before's output)"
KEEP_BYTES = 1 << 30  # the stale probe keeps the call before's outputs (in fp32) up to this size


def _like(exp: Expected, fill) -> object:
    """An output of exp's structure: each tensor element fill(i, spec) (a tensor of its shape, dtype and device),
    each non-tensor element the reference's own value."""
    outs = [fill(i, spec) if errs is not None else spec for i, (spec, errs) in enumerate(zip(exp.specs, exp.errs))]
    return tuple(outs) if exp.is_tuple else outs[0]


def _zeros(exp: Expected):
    return _like(exp, lambda i, s: torch.zeros(s[0], dtype=s[1], device=s[2]))


def _constant(exp: Expected):
    def fill(i, s):
        ref = exp.r64[i]
        mean = float(ref[torch.isfinite(ref)].mean()) if ref.numel() and torch.isfinite(ref).any() else 0.0
        return torch.full(s[0], mean, dtype=s[1], device=s[2])

    return _like(exp, fill)


def _low_precision(r32: torch.nn.Module, pristine: list, dtype: torch.dtype, exp: Expected):
    """The reference's model and its floating inputs cast to dtype, called, its outputs cast back to the specs."""
    model = copy.deepcopy(r32).to(dtype)
    xs = [x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in pristine]
    with torch.no_grad():
        y = _as_list(model(*xs))
    del model, xs
    return _like(exp, lambda i, s: y[i].to(s[1]).to(s[2]) if isinstance(y[i], torch.Tensor) else y[i])


class Probes:
    """The probes of one judge's benchmark-shape parity: each probe's state (passed at every call so far, or the
    call and the figures that rejected it) across the calls it sees. precision: the judged one (the low-precision
    probes run in fp32 and tf32 only)."""

    def __init__(self, precision: str):
        self.precision = precision
        self.results: dict[str, dict] = {}
        self.prev = None  # the call before's fp32 reference output (the stale probe)
        self.shape: str | None = None

    def _alive(self, name: str) -> bool:
        r = self.results.get(name)
        return r is None or r["accepted"]

    def see(self, label: str, r32: torch.nn.Module, pristine: list, exp: Expected, shape: str) -> None:
        """Judge every probe still standing at this call (label), with the call's budgets; its float64 outputs,
        rounded to the outputs' dtypes, are the next call's stale probe (kept where they are at most KEEP_BYTES)."""
        self.shape = shape
        candidates = [("zeros", lambda: _zeros(exp)), ("constant", lambda: _constant(exp))]
        tensors = [i for i, x in enumerate(pristine) if isinstance(x, torch.Tensor)]
        for i in tensors:
            x = pristine[i]
            if any(
                errs is not None and tuple(x.shape) == spec[0] and x.dtype == spec[1] and x.device == spec[2]
                for spec, errs in zip(exp.specs, exp.errs)
            ):
                candidates.append((f"input {i} passed through", lambda x=x: _like(exp, lambda j, s: x)))
        if self.prev is not None:
            candidates.append((STALE, lambda prev=self.prev: prev))
        if self.precision in ("fp32", "tf32"):
            # fp16 keeps TF32's 10-bit mantissa: in the tf32 mode it is no shortcut, bf16's 7 bits are
            for name, dtype in [(n, d) for n, d in LOW_PRECISIONS.items() if self.precision == "fp32" or n == "bf16"]:
                candidates.append(
                    (f"the reference in {name}", lambda dtype=dtype: _low_precision(r32, pristine, dtype, exp))
                )
        for name, make in candidates:
            if not self._alive(name):
                continue
            r = self.results.setdefault(name, {"accepted": True, "calls": 0})
            out = None
            try:
                out = make()
                judge_output(f"probe {name}", out, describe(out), exp)
                r["calls"] += 1
            except Rejected as e:
                figs = failed_figures(e) or {}
                self.results[name] = {
                    "accepted": False,
                    "calls": r["calls"],
                    "at": label,
                    "kind": e.kind,
                    **({"rel_l2": figs["rel_l2"], "budget": figs["budget"]} if "rel_l2" in figs else {}),
                }
            except Exception as e:  # a probe that cannot be made or compared here (no room; no bf16 kernel)
                self.results[name] = {
                    "accepted": False,
                    "calls": r["calls"],
                    "at": label,
                    "why": f"not judged: {type(e).__name__}: {first_line(e)[:100]}",
                }
            del out
        release_cached()
        self.prev = None  # kept only while the stale probe stands: a copy of every output, up to KEEP_BYTES
        if self._alive(STALE):
            size = sum(t.numel() * t.element_size() for t in exp.r64 if isinstance(t, torch.Tensor)) // 2
            if size <= KEEP_BYTES:
                self.prev = _like(exp, lambda i, s: exp.r64[i].to(s[1]).to(s[2]))
            else:
                self.results[STALE] = {
                    "accepted": False,
                    "calls": 0,
                    "why": f"not judged: outputs over {KEEP_BYTES >> 30} GiB",
                }

    def weak(self) -> list[str]:
        """The probes every call they saw accepted."""
        return [k for k, r in self.results.items() if r["accepted"] and r["calls"]]

    def note(self) -> str | None:
        """The one line the verdict and the record carry where a probe passed, else None."""
        weak = self.weak()
        if not weak:
            return None
        return (
            f"this reference cannot tell a right kernel from {', '.join(weak)} at {self.shape}: each passes "
            f"every benchmark-shape call's check (a candidate returning it would be accepted)"
        )

    def record(self) -> dict:
        return {"shape": self.shape, "probes": self.results, "weak": self.weak()}
