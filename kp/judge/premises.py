"""What every draw of a reference's ``get_inputs()`` shares, learned from the parity trials' draws, so that a derived
input (negated, x100, shifted) is used only where it keeps the problem's premise.

A premise is a structural fact of the inputs that a kernel may rightly exploit: an exact zero pattern (triangular,
diagonal or any fixed mask: a triangular-matrix product may skip the zero half) or symmetry. Signs and value ranges
are not premises: most reference files draw with ``torch.rand``, and a kernel that is right only on [0, 1) is what the
derived inputs exist to catch; where a range matters to the problem itself, the float64 reference leaves the finite
range, PyTorch's own fp32 result fails its check, or the reference raises, and the derived input is skipped for that
reason instead (kp.judge.driver).
"""

from __future__ import annotations

import torch

# What each derived input keeps of the premises (the judge's DERIVED transforms, by name).
KEEPS = {
    "negated": {"zero pattern", "symmetric"},
    "scaled x100": {"zero pattern", "symmetric"},
    "shifted -10": {"symmetric"},
}


def _zero_kind(where: torch.Tensor, shape: tuple) -> str:
    """How the zeros at flat positions `where` of a tensor of `shape` lie: upper-triangular (zeros below the
    diagonal), lower-triangular, diagonal, or a mask."""
    mask = torch.zeros(shape, dtype=torch.bool, device=where.device).reshape(-1)
    mask[where] = True
    mask = mask.reshape(shape)
    if mask.dim() >= 2 and mask.shape[-1] == mask.shape[-2]:
        n = mask.shape[-1]
        below = torch.ones(n, n, dtype=torch.bool, device=mask.device).tril(-1)
        above = below.T
        m = mask.reshape(-1, n, n)
        if bool((m == below).all()):
            return "upper-triangular zero pattern"
        if bool((m == above).all()):
            return "lower-triangular zero pattern"
        if bool((m == (below | above)).all()):
            return "diagonal zero pattern"
    return f"zero pattern ({where.numel()} exact zeros at the same positions)"


class Premises:
    """Fed each trial's inputs (`see`); then `broken(transform)` names the premises a derived input would break."""

    def __init__(self):
        # input index -> flat positions that were exactly zero in every draw so far (None: no such position)
        self.zeros: dict[int, torch.Tensor | None] = {}
        self.shapes: dict[int, tuple] = {}
        self.symmetric: dict[int, bool] = {}
        self.draws = 0

    def see(self, inputs: list) -> None:
        """The pattern is the positions zero in *every* draw, not one draw's zeros: a large draw has stray exact
        zeros of its own (``torch.randn`` or ``torch.rand`` of 4096 x 4096 holds zero to three), which land elsewhere
        each time and would otherwise erase a triangular pattern (KernelBench's triangular product at N = 4096)."""
        self.draws += 1
        for i, x in enumerate(inputs):
            if not (isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel()):
                continue
            if self.draws == 1 or self.zeros.get(i) is not None:
                where = (x == 0).reshape(-1).nonzero().squeeze(1)  # no zeros: an empty tensor, a few bytes
                if self.draws == 1:
                    self.shapes[i] = tuple(x.shape)
                elif tuple(x.shape) != self.shapes[i]:
                    where = where[:0]
                else:
                    where = where[torch.isin(where, self.zeros[i])]
                self.zeros[i] = where if where.numel() else None
            sym = (
                x.dim() >= 2
                and x.shape[-1] == x.shape[-2]
                and x.shape[-1] > 1
                and bool(torch.equal(x, x.transpose(-1, -2)))
            )
            self.symmetric[i] = self.symmetric.get(i, True) and sym

    def facts(self) -> dict[int, list[str]]:
        """input index -> the premises every draw so far had."""
        out = {}
        for i in set(self.zeros) | set(self.symmetric):
            f = []
            if self.zeros.get(i) is not None:
                f.append(("zero pattern", _zero_kind(self.zeros[i], self.shapes[i])))
            if self.symmetric.get(i):
                f.append(("symmetric", "symmetry"))
            if f:
                out[i] = f
        return out

    def broken(self, transform: str) -> str | None:
        """Why `transform` breaks a premise every draw has ('the upper-triangular zero pattern every draw of input
        0 has'), or None when it keeps them all. Needs two draws at least: one draw shows no pattern."""
        if self.draws < 2:
            return None
        for i, facts in sorted(self.facts().items()):
            for kind, words in facts:
                if kind not in KEEPS[transform]:
                    return f"breaks the {words} every draw of input {i} has"
        return None

    def forget(self) -> None:
        self.zeros.clear()
