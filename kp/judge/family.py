"""A reference's shape family: the module-level sizes its get_inputs() alone reads (neither get_init_inputs() nor
Model's code reads them, so the model, its weights and every operator's parameters stay as they are when they
change). The CPU judges a too-large reference at a smaller member (scale_to_fit); `--shapes N` judges a candidate at
N members besides the benchmark's (family): those the file declares (SHAPE_FAMILY), then odd sizes, smaller, a batch
of one, larger; with timing on, each member is timed too (kp.judge.timed), the speed curve."""
from __future__ import annotations

import torch

from kp.errors import UsageError


def _code_names(code) -> set[str]:
    """The global names a function's code reads, its nested functions' and comprehensions' included."""
    if code is None:
        return set()
    out = set(code.co_names)
    for c in code.co_consts:
        if hasattr(c, "co_names"):
            out |= _code_names(c)
    return out


def _odd(n: int) -> int:
    """An odd size just under n (1023 for 1024, 1001 for 1003): no power of two, no multiple of a tile divides it."""
    return max(1, n - 1 if n % 2 == 0 else n - 2)


# The members --shapes N takes, in order (the first N that apply): each maps a size to its value there. Odd sizes
# first (a width assumed a multiple of the tile), then half (fewer rows than a hard-coded count: slices clip, an
# index past the end does not), a batch of one, double (rows past a hard-coded count left unwritten), then odd
# halves and odd doubles.
MEMBERS = (
    ("odd", lambda n, batch: _odd(n)),
    ("half", lambda n, batch: max(1, n // 2)),
    ("one", lambda n, batch: 1 if batch else n),
    ("double", lambda n, batch: 2 * n),
    ("odd half", lambda n, batch: max(1, (n // 2) | 1)),
    ("odd double", lambda n, batch: 2 * n + 1),
)


def module_sizes(module) -> dict[str, int]:
    """A module's integer globals: what a judge may change (scale_to_fit, family) and puts back."""
    return {k: v for k, v in vars(module).items() if type(v) is int and not k.startswith("__")}


def member_names(names) -> list[str]:
    """Members named on a command line ('odd', 'odd-half' or 'odd half'), checked against MEMBERS."""
    known = [m for m, _ in MEMBERS]
    out = [str(x).strip().replace("-", " ") for x in names]
    bad = [x for x in out if x not in known]
    if bad:
        raise UsageError(f"--shapes: no member {', '.join(map(repr, bad))}; a count, or some of "
                         f"{', '.join(m.replace(' ', '-') for m in known)}")
    return out


def parse_shapes(text: str):
    """--shapes as given: a count ('4') or members' names ('odd,double')."""
    text = str(text).strip()
    return int(text) if text.isdigit() else tuple(member_names(text.split(",")))


class ShapeFamily:
    """Methods of kp.judge.reference.Reference (self.module: the reference's module)."""

    def family_sizes(self) -> list[str]:
        """The module-level integer sizes get_inputs() reads and neither get_init_inputs() nor Model's code does."""
        g = vars(self.module)
        reads = lambda f: _code_names(getattr(f, "__code__", None))
        model_names = set().union(*(_code_names(getattr(v, "__code__", None))
                                    for c in self.module.Model.__mro__ if c.__module__ == self.module.__name__
                                    for v in vars(c).values()), set())
        return [n for n in sorted(reads(self.module.get_inputs) - reads(self.module.get_init_inputs) - model_names)
                if type(g.get(n)) is int and g[n] > 0]

    def family(self, n) -> tuple[list[tuple[str, dict[str, tuple[int, int]]]], str | None]:
        """Up to n members of the family besides the shape the sizes have now (n: a count, or the members' names,
        MEMBERS): [(name, {size: (now, there)})], and why none where there are none. With a count, the members the
        file declares (SHAPE_FAMILY) come first, spread over its list; the generic ones fill up to n. A member whose
        inputs get_inputs() cannot draw on the meta device, or whose inputs differ in number or rank from the
        benchmark's, is not one (the sizes go together in ways the file does not say)."""
        g = vars(self.module)
        names = self.family_sizes()
        if not names:
            return [], "no module-level size that get_inputs() alone reads sets its inputs' shapes"
        base = self._meta_shapes()
        if base is None:
            return [], "its get_inputs() does not run on the meta device, where shapes are tried"
        batch = {}
        for name in names:  # a batch size moves dimension 0 of the inputs only
            dims = self._dims_moved(name, g[name] + 1, base)
            batch[name] = dims is not None and any(dims) and all(d <= {0} for d in dims)
        if isinstance(n, int):
            declared = self.declared_members(names)
            picks = sorted({round(i * (len(declared) - 1) / (n - 1)) for i in range(n)} if n > 1 else
                           {len(declared) // 2}) if declared and n else []
            candidates = [declared[i] for i in picks] + \
                [(m, {k: f(g[k], batch[k]) for k in names}) for m, f in MEMBERS]
        else:
            wanted = set(member_names(n))
            candidates = [(m, {k: f(g[k], batch[k]) for k in names}) for m, f in MEMBERS if m in wanted]
            n = len(candidates)
        out, seen = [], {tuple(base)}
        for member, there in candidates:
            if len(out) == n:
                break
            sizes = {k: (g[k], v) for k, v in there.items() if g[k] != v}
            if not sizes:
                continue
            shapes = self._shapes_at({k: v[1] for k, v in sizes.items()}, base)
            if shapes is None or tuple(shapes) in seen:
                continue
            seen.add(tuple(shapes))
            out.append((member, sizes))
        return out, None if out else "no member of its family draws inputs of the benchmark's number and ranks"

    def declared_members(self, names: list[str] | None = None) -> list[tuple[str, dict[str, int]]]:
        """The members a file declares in SHAPE_FAMILY (a list of {size: value}), each named "declared": the shapes
        its author wants judged and timed (a problem's sweep). A size that is not one of the family's (one the model
        or get_init_inputs() reads too) is a usage error, said before anything runs."""
        names = self.family_sizes() if names is None else names
        out = []
        for entry in getattr(self.module, "SHAPE_FAMILY", None) or []:
            bad = sorted(set(entry) - set(names))
            if bad or not all(type(v) is int and v > 0 for v in entry.values()):
                raise UsageError(f"{self.name}: SHAPE_FAMILY entry {entry} sets {', '.join(bad) or 'a size'} that is "
                                 f"not a positive size get_inputs() alone reads (the family's: {', '.join(names)})")
            out.append(("declared", dict(entry)))
        return out

    def scale_to_fit(self, fits) -> dict[str, tuple[int, int]]:
        """Shrink the reference's own shape family until `fits(footprint)` holds, and return what changed
        ({global: (benchmark value, judged value)}), or {} where no allowed change makes it fit (nothing is
        changed then). Only module-level integers that get_inputs() reads and that neither get_init_inputs() nor
        Model's code reads may change, so the model, its weights and every operator's parameters stay as they
        are. The batch (a size that moves only dimension 0 of the inputs) is halved first; then sizes that move no
        input's last dimension (spatial extents, sequence lengths); the last dimension, the row most operators
        reduce, is kept. Each size is halved down to 2 at the least; sizes are tried on the meta device, where
        nothing is allocated. Where it returns {}, `no_smaller_shape` says why."""
        g = vars(self.module)
        names = [n for n in self.family_sizes() if g[n] > 2]
        base = self._meta_shapes()
        if base is None:
            self.no_smaller_shape = "its get_inputs() does not run on the meta device, where shapes are tried"
            return {}
        moves = {}
        for n in names:
            dims = self._dims_moved(n, g[n] // 2, base)
            if dims is None:
                continue
            moved = [(len(a), d) for a, d in zip(base, dims)]
            rows = any(nd >= 2 and nd - 1 in dims for nd, dims in moved)  # a matrix's last dimension: its rows
            wide = any(nd >= 2 and dims for nd, dims in moved)  # a 1-D input alone is one row: kept too
            if wide and not rows:
                moves[n] = 0 if all(dims <= {0} for _, dims in moved) else 1  # the batch first
        original = {n: g[n] for n in moves}
        for n in sorted(moves, key=lambda n: (moves[n], -g[n])):
            ok = self._fits(fits)
            while not ok and g[n] > 2:
                g[n] = max(2, g[n] // 2)
                ok = self._fits(fits)
            if ok:
                return {k: (v, g[k]) for k, v in original.items() if g[k] != v}
        if moves:
            self.no_smaller_shape = f"even at {', '.join(f'{n} = {g[n]}' for n in moves)} it does not fit"
        else:
            self.no_smaller_shape = "no module-level size that get_inputs() alone reads sets its batch or extents"
        g.update(original)
        return {}

    def _shapes_at(self, sizes: dict[str, int], base: list[tuple]) -> list[tuple] | None:
        """The shapes get_inputs() draws with `sizes` set (and put back after), or None where the meta device cannot
        draw them or they differ from `base` in number or rank."""
        g = vars(self.module)
        old = {k: g[k] for k in sizes}
        g.update(sizes)
        try:
            shapes = self._meta_shapes()
        finally:
            g.update(old)
        if shapes is None or len(shapes) != len(base) or any(len(a) != len(b) for a, b in zip(base, shapes)):
            return None
        return shapes

    def _dims_moved(self, name: str, value: int, base: list[tuple]) -> list[set[int]] | None:
        """Per input, the dimensions that change when the size `name` is `value` (_shapes_at's None where none)."""
        shapes = self._shapes_at({name: value}, base)
        return None if shapes is None else [{d for d in range(len(a)) if a[d] != b[d]} for a, b in zip(base, shapes)]

    def _fits(self, fits) -> bool:
        """Whether the shapes as the module's sizes stand now fit (False where the meta-device run fails)."""
        try:
            return bool(fits(self._meta_footprint()))
        except Exception:
            return False

    def _meta_shapes(self) -> list[tuple] | None:
        """The shapes get_inputs() draws, traced on the meta device, or None where it cannot run there."""
        try:
            with torch.device("meta"):
                torch.manual_seed(0)
                xs = self.module.get_inputs()
        except Exception:
            return None
        return [tuple(x.shape) if isinstance(x, torch.Tensor) else () for x in xs]
