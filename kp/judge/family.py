"""A reference's shape family: the module-level sizes its get_inputs() alone reads (neither get_init_inputs() nor
Model's code reads them, so the model, its weights and every operator's parameters stay as they are when they
change). The CPU judges a too-large reference at a smaller member (scale_to_fit); `--shapes N` judges a candidate at
N members besides the benchmark's (family): those the file declares (SHAPE_FAMILY), then odd sizes, smaller, a batch
of one, larger; with timing on, each member is timed too (kp.judge.timed), the speed curve. A global the file
computes from a size at import (`input_shape = (num_classes,)`) follows it: its top-level assignment is evaluated
again with the size's new value, so the member's inputs agree with each other as the file means them to."""

from __future__ import annotations

import ast
import contextlib
from pathlib import Path

import torch

from kp.errors import UsageError
from kp.judge.members import MEMBERS, _odd, at_values, count_order, member_names


def _code_names(code) -> set[str]:
    """The global names a function's code reads, its nested functions' and comprehensions' included."""
    if code is None:
        return set()
    out = set(code.co_names)
    for c in code.co_consts:
        if hasattr(c, "co_names"):
            out |= _code_names(c)
    return out


def module_sizes(module) -> dict:
    """A module's integer globals and those made of them (floats, tuples): what a judge may change (scale_to_fit,
    family, and the globals that follow them) and puts back."""
    return {k: v for k, v in vars(module).items() if type(v) in (int, float, tuple) and not k.startswith("__")}


def same_value(a, b) -> bool:
    """Equal and of one type (an int size, or a tuple of them)."""
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # a tensor, or anything whose == is not a truth value
        return a is b


def _assigned(targets, value):
    """(name, value) for each plain name an assignment binds (a tuple of names unpacked), None where it binds
    something else (an attribute, a subscript)."""
    out = []
    for t in targets:
        if isinstance(t, ast.Name):
            out.append((t.id, value))
        elif isinstance(t, (ast.Tuple, ast.List)) and all(isinstance(e, ast.Name) for e in t.elts):
            try:
                values = list(value)
            except TypeError:
                return None
            if len(values) != len(t.elts):
                return None
            out += [(e.id, v) for e, v in zip(t.elts, values)]
        else:
            return None
    return out


class ShapeFamily:
    """Methods of kp.judge.reference.Reference (self.module: the reference's module)."""

    def family_sizes(self) -> list[str]:
        """The module-level integer sizes get_inputs() reads (itself, or through a global computed from them at
        import) and neither get_init_inputs() nor Model's code does (nor through such a global)."""
        g = vars(self.module)
        reads = lambda f: _code_names(getattr(f, "__code__", None))
        model_names = set().union(
            *(
                _code_names(getattr(v, "__code__", None))
                for c in self.module.Model.__mro__
                if c.__module__ == self.module.__name__
                for v in vars(c).values()
            ),
            set(),
        )
        inputs, fixed = reads(self.module.get_inputs), reads(self.module.get_init_inputs) | model_names
        out = []
        for n in sorted(k for k, v in g.items() if type(v) is int and v > 0 and not k.startswith("__")):
            follow = self._following({n: g[n] + 1})
            if follow is None:
                continue
            moved = {n, *follow}
            if moved & inputs and not moved & fixed:
                out.append(n)
        return out

    def _assignments(self) -> list[tuple[list, object, set[str]]]:
        """The file's top-level assignments, in order: (targets, compiled value, the names the value reads)."""
        if "_kp_assignments" not in vars(self):
            out = []
            try:
                tree = ast.parse(Path(self.module.__file__).read_text())
            except (OSError, TypeError, AttributeError, SyntaxError, ValueError):
                tree = ast.Module(body=[], type_ignores=[])
            for node in tree.body:
                if isinstance(node, ast.Assign) or (isinstance(node, ast.AnnAssign) and node.value is not None):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    reads = {x.id for x in ast.walk(node.value) if isinstance(x, ast.Name)}
                    code = compile(ast.Expression(node.value), str(self.module.__file__), "eval")
                    out.append((targets, code, reads))
            self._kp_assignments = out
        return self._kp_assignments

    def _following(self, sizes: dict) -> dict | None:
        """The globals computed at import from `sizes` ({name: new value}), evaluated again with the new values:
        {name: (now, there)} for those that change, or None where that evaluation raises (the sizes do not go
        together)."""
        g = vars(self.module)
        ns, moved, out = {**g, **sizes}, set(sizes), {}
        inputs = _code_names(getattr(self.module.get_inputs, "__code__", None))
        for targets, code, reads in self._assignments():
            if not reads & moved:
                continue
            try:
                value = eval(code, ns)
            except Exception:
                return None
            bound = _assigned(targets, value)
            if bound is None:
                return None
            for name, v in bound:
                if name in sizes:  # the size's own assignment: the member's value stands
                    continue
                if type(v) not in (int, float, tuple) and name not in inputs:  # a table of members, a case list
                    continue
                ns[name] = v
                moved.add(name)
                if not same_value(g.get(name), v):
                    out[name] = (g.get(name), v)
        return out

    def _with_following(self, sizes: dict) -> dict | None:
        """{name: (now, there)} for `sizes` ({name: new value}) and the globals that follow them, or None."""
        g = vars(self.module)
        follow = self._following(sizes)
        return None if follow is None else {**{k: (g[k], v) for k, v in sizes.items()}, **follow}

    def family(
        self, n, spares: bool = False, train: bool = True
    ) -> tuple[list[tuple[str, dict[str, tuple[int, int]]]], str | None]:
        """Up to n members of the family besides the shape the sizes have now (n: a count, or the members' names,
        MEMBERS): [(name, {size: (now, there)})], and why none where there are none. With a count, the members the
        file declares (SHAPE_FAMILY) come first, spread over its list; the generic ones fill up to n, and with
        `spares` the rest follow (for a judge to take in order where the reference itself raises at one). A member
        whose inputs get_inputs() cannot draw on the meta device, or whose inputs differ in number or rank from the
        benchmark's, is not one (the sizes go together in ways the file does not say); a size the model takes at no
        other value is held (fixed_sizes)."""
        g = vars(self.module)
        names = self.family_sizes()
        if not names:
            return [], "no module-level size that get_inputs() alone reads sets its inputs' shapes"
        base = meta_shapes(self.module)
        if base is None:
            return [], "its get_inputs() does not run on the meta device, where shapes are tried"
        self.held_sizes = fixed = self.fixed_sizes(names, train)
        names = [k for k in names if k not in fixed]
        if not names:
            return [], f"its model takes no other value of {', '.join(fixed)} (tried on the meta device)"
        batch = {}
        for name in names:  # a batch size moves dimension 0 of the inputs only
            dims = self._dims_moved(name, g[name] + 1, base)
            batch[name] = dims is not None and any(dims) and all(d <= {0} for d in dims)
        if isinstance(n, int):
            declared = self.declared_members(names)
            picks = (
                sorted({round(i * (len(declared) - 1) / (n - 1)) for i in range(n)} if n > 1 else {len(declared) // 2})
                if declared and n
                else []
            )
            sized = dict(MEMBERS)
            candidates = [declared[i] for i in picks] + [
                (m, {k: sized[m](g[k], batch[k]) for k in names}) for m in count_order(n - len(picks))
            ]
        else:
            wanted = set(member_names(n))
            candidates = [(m, {k: f(g[k], batch[k]) for k in names}) for m, f in MEMBERS if m in wanted]
            n = len(candidates)
        out, seen = [], {tuple(base)}
        for member, there in candidates:
            if len(out) == n and not spares:
                break
            sizes = self._with_following({k: v for k, v in there.items() if g[k] != v})
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
                raise UsageError(
                    f"{self.name}: SHAPE_FAMILY entry {entry} sets {', '.join(bad) or 'a size'} that is "
                    f"not a positive size get_inputs() alone reads (the family's: {', '.join(names)})"
                )
            out.append(("declared", dict(entry)))
        return out

    def fixed_sizes(self, names: list[str], train: bool = True) -> list[str]:
        """The family's sizes its model takes at no other value: moved alone to its odd value and to its double, the
        model raises on the meta device both times (a channel count its first layer fixes, the image size its
        patches or position embeddings assume), and so it does with every size moved together (two sizes that must
        stay equal, each refused alone, go together: none is held). Empty where the model does not run on meta at
        the file's own sizes: there nothing can be told, and each member is tried as it is judged."""
        if not self._runs_on_meta({}, train):
            return []
        g = vars(self.module)
        moves = lambda k: (_odd(g[k]), 2 * g[k])
        alone = [k for k in names if not any(self._runs_on_meta({k: v}, train) for v in moves(k))]
        if not alone or any(self._runs_on_meta({k: moves(k)[i] for k in names}, train) for i in (0, 1)):
            return []
        return alone

    def _runs_on_meta(self, sizes: dict[str, int], train: bool) -> bool:
        """Whether the model, made as the judge makes it (precision, mode), runs on inputs drawn at `sizes` on the
        meta device, where nothing is allocated."""
        with self._set(sizes) as ok:
            if not ok:
                return False
            try:
                with torch.device("meta"), torch.no_grad():
                    xs, model = self.made_on("meta", train)
                    model(*xs)
                return True
            except Exception:
                return False

    def _shapes_at(self, sizes: dict[str, int], base: list[tuple]) -> list[tuple] | None:
        """The shapes get_inputs() draws with `sizes` set (and put back after), or None where the meta device cannot
        draw them or they differ from `base` in number or rank."""
        with self._set(sizes) as ok:
            shapes = meta_shapes(self.module) if ok else None
        if shapes is None or len(shapes) != len(base) or any(len(a) != len(b) for a, b in zip(base, shapes)):
            return None
        return shapes

    def _dims_moved(self, name: str, value: int, base: list[tuple]) -> list[set[int]] | None:
        """Per input, the dimensions that change when the size `name` is `value` (_shapes_at's None where none)."""
        shapes = self._shapes_at({name: value}, base)
        return None if shapes is None else [{d for d in range(len(a)) if a[d] != b[d]} for a, b in zip(base, shapes)]

    def _fits_at(self, sizes: dict, fits) -> bool:
        """Whether the shapes at `sizes` ({name: value}, the globals that follow them too) fit (False where the
        meta-device run fails)."""
        with self._set(sizes) as ok:
            try:
                return ok and bool(fits(self._meta_footprint()))
            except Exception:
                return False

    @contextlib.contextmanager
    def _set(self, sizes: dict):
        """The module's globals at `sizes` and those that follow them for the block, put back after; yields False
        (nothing set) where they do not go together."""
        g = vars(self.module)
        full = self._with_following(sizes)
        if full is None:
            yield False
            return
        g.update({k: v for k, (_, v) in full.items()})
        try:
            yield True
        finally:
            g.update({k: v for k, (v, _) in full.items()})


def apply_at(ref, at: str) -> dict[str, tuple]:
    """--at (kp.judge.members.parse_at's spelling) for a reference (kp.judge.reference.Reference): the sizes of the
    shape judged in place of the benchmark's, {name: (now, there)} with the globals that follow them ({} where they
    are the benchmark's own): a member of the family by name, the file's TEST_SIZES ("test"), or sizes by name, each
    one of the family's (family_sizes: the model and its weights stay as they are), set in the reference's module.
    A usage error, said before anything runs, where a size is not one of them, or where get_inputs() draws inputs of
    another number or rank there."""
    g = vars(ref.module)
    if at != "test" and "=" not in at:
        members, why = ref.family((at,))
        if not members:
            raise UsageError(f"--at {at}: {why or 'that member draws the benchmark shape itself'}")
        return _set_at(g, members[0][1])
    wanted = getattr(ref.module, "TEST_SIZES", None) if at == "test" else at_values(at)
    if at == "test" and not (isinstance(wanted, dict) and wanted):
        raise UsageError(
            f"--at test: {ref.name} declares no TEST_SIZES (a dict of its sizes, e.g. "
            f"{{'batch_size': 64}}); name the sizes (--at batch_size=64) or a member (--at half)"
        )
    names = ref.family_sizes()
    bad = sorted(k for k, v in wanted.items() if k not in names or type(v) is not int or v < 1)
    if bad:
        raise UsageError(
            f"--at {at}: {', '.join(bad)} is not a positive size get_inputs() alone reads (the "
            f"family's: {', '.join(names) or 'none'})"
        )
    sizes = ref._with_following({k: v for k, v in wanted.items() if g[k] != v})
    if sizes is None:
        raise UsageError(f"--at {at}: the file's globals computed from these sizes raise: they do not go together")
    base = meta_shapes(ref.module)
    if sizes and base is not None and ref._shapes_at({k: v for k, (_, v) in sizes.items()}, base) is None:
        raise UsageError(f"--at {at}: get_inputs() draws inputs of another number or rank there")
    return _set_at(g, sizes)


def _set_at(g: dict, sizes: dict[str, tuple]) -> dict[str, tuple]:
    """The judged values of `sizes` ({name: (now, there)}) set in a module's globals; returns `sizes`."""
    g.update({k: v for k, (_, v) in sizes.items()})
    return sizes


def meta_shapes(module) -> list[tuple] | None:
    """The shapes a reference module's get_inputs() draws, traced on the meta device, or None where it cannot run
    there."""
    try:
        with torch.device("meta"):
            torch.manual_seed(0)
            xs = module.get_inputs()
    except Exception:
        return None
    return [tuple(x.shape) if isinstance(x, torch.Tensor) else () for x in xs]


def scale_to_fit(ref, fits) -> dict[str, tuple[int, int]]:
    """Shrink a reference's (a ShapeFamily's) own shape family until `fits(footprint)` holds, and return what changed
    ({global: (benchmark value, judged value)}), or {} where no allowed change makes it fit (nothing is
    changed then). Only module-level integers that get_inputs() reads and that neither get_init_inputs() nor
    Model's code reads may change, so the model, its weights and every operator's parameters stay as they
    are. The batch (a size that moves only dimension 0 of the inputs) is halved first; then sizes that move no
    input's last dimension (spatial extents, sequence lengths); the last dimension, the row most operators
    reduce, is kept. Each size is halved down to 2 at the least; sizes are tried on the meta device, where
    nothing is allocated. Where it returns {}, `no_smaller_shape` says why."""
    g = vars(ref.module)
    names = [n for n in ref.family_sizes() if g[n] > 2]
    base = meta_shapes(ref.module)
    if base is None:
        ref.no_smaller_shape = "its get_inputs() does not run on the meta device, where shapes are tried"
        return {}
    moves = {}
    for n in names:
        dims = ref._dims_moved(n, g[n] // 2, base)
        if dims is None:
            continue
        moved = [(len(a), d) for a, d in zip(base, dims)]
        rows = any(nd >= 2 and nd - 1 in dims for nd, dims in moved)  # a matrix's last dimension: its rows
        wide = any(nd >= 2 and dims for nd, dims in moved)  # a 1-D input alone is one row: kept too
        if wide and not rows:
            moves[n] = 0 if all(dims <= {0} for _, dims in moved) else 1  # the batch first
    now = {n: g[n] for n in moves}
    for n in sorted(moves, key=lambda n: (moves[n], -g[n])):
        ok = ref._fits_at(now, fits)
        while not ok and now[n] > 2:
            now[n] = max(2, now[n] // 2)
            ok = ref._fits_at(now, fits)
        if ok:
            changed = ref._with_following({k: v for k, v in now.items() if g[k] != v}) or {}
            g.update({k: v for k, (_, v) in changed.items()})
            return changed
    if moves:
        ref.no_smaller_shape = f"even at {', '.join(f'{n} = {now[n]}' for n in moves)} it does not fit"
    else:
        ref.no_smaller_shape = "no module-level size that get_inputs() alone reads sets its batch or extents"
    return {}
