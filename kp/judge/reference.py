"""The reference: any KernelBench-format file (``Model``, ``get_inputs()``, ``get_init_inputs()``) or a built-in
problem, with its inputs under a seed, its declared cases and its footprint (FLOPs and the byte floor)."""

from __future__ import annotations

import contextlib

import hashlib
import importlib.util
import json
import os
import sys
import warnings
from pathlib import Path

import torch

from kp.judge.family import ShapeFamily, module_sizes
from kp.lib.build import require_gpu
from kp.errors import ReferenceRaised, UsageError, first_line
from kp.lib.numerics import HALF, batch_rows, cast_floats, precision_dtype, unit_roundoff
from kp.lib.op_modes import EagerMode, FlopCount
from kp.lib.registry import problem_module

# The changes made to the weights between parity calls, in this order (cycled when there are more trials).
UPDATES = ("optimizer step", "load_state_dict", "in-place edit")
UPDATE_SIZE = 0.01  # each change moves a parameter by ~1% of its mean magnitude: far above any rounding budget
# in fp32 and fp16; in bf16, whose one rounding is 0.4% (a budget of about 1% after two), 1% would move an output no
# further than its budget, so a change there is 8 u of the parameters' dtype where that is larger (bf16: 3.1%).
UPDATE_ROUNDINGS = 8
# A reference's declared edge cases build layers with no elements (a Linear of 0 input features); torch's initialisers
# warn that initialising them does nothing, which is the point: the judge and its workers do not repeat it.
warnings.filterwarnings("ignore", message="Initializing zero-element tensors is a no-op", category=UserWarning)


def update_size(dtype: torch.dtype) -> float:
    return max(UPDATE_SIZE, UPDATE_ROUNDINGS * unit_roundoff(dtype)) if dtype.is_floating_point else UPDATE_SIZE


# ---------------------------------------------------------------------------------------------------------------
# The reference.


class Reference(ShapeFamily):
    """A KernelBench-format reference: a built-in problem module or any file with Model, get_inputs and
    get_init_inputs. Optional extras: CASES, traffic, BOUND, PRECISIONS, ModelNew/variants (built-in problems)."""

    def __init__(self, module, name: str, spec: tuple[str, str]):
        missing = [k for k in ("Model", "get_inputs", "get_init_inputs") if not hasattr(module, k)]
        if missing:
            raise UsageError(f"{spec[1]} is not a KernelBench-format reference: it defines no {', '.join(missing)}")
        self.module, self.name, self.spec = module, name, spec
        self.cases = dict(getattr(module, "CASES", {}))
        self.precisions = tuple(getattr(module, "PRECISIONS", ("fp32",)))
        self.bound = getattr(module, "BOUND", None)
        self.problem = spec[1] if spec[0] == "problem" else None
        self.host_draw: str | None = None  # why get_inputs() is drawn on the host, where it could not run on the device
        self.no_smaller_shape = ""  # why scale_to_fit found no smaller shape of the family, once it has looked
        self.held_sizes: list[str] = []  # the family's sizes its model takes at no other value, once family() looked
        self.dtype: torch.dtype | None = None  # fp16/bf16 modes: every floating input, weight and buffer cast to it

    def use_precision(self, precision: str) -> "Reference":
        """Judge in `precision`: in fp16 and bf16, the inputs, the init inputs, the declared cases and the models
        this reference makes are cast to that dtype (kp.lib.numerics.PRECISION_DTYPES says why)."""
        self.dtype = precision_dtype(precision) if precision in HALF else None
        return self

    @classmethod
    def load(cls, spec: tuple[str, str]) -> "Reference":
        kind, what = spec
        if kind == "problem":  # one module per process, which a judge before this one may have left at a smaller
            module = problem_module(what)  # shape of its family: its own sizes, as the file has them, put back
            vars(module).update(vars(module).setdefault("_kp_file_sizes", module_sizes(module)))
            return cls(module, what, spec)
        path = Path(what).resolve()
        if not path.is_file():
            raise UsageError(f"reference file {what!r} does not exist")
        if path.suffix != ".py":
            raise UsageError(
                f"reference file {what!r} is not a Python file: a reference is a .py file that defines "
                f"Model, get_inputs() and get_init_inputs()"
            )
        name = f"kp_ref_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}"
        sp = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(sp)
        sys.modules[name] = module
        try:
            sp.loader.exec_module(module)
        except Exception as e:
            raise UsageError(f"reference file {what}: import failed: {type(e).__name__}: {first_line(e)}") from None
        return cls(module, path.stem, ("file", str(path)))

    def init(self) -> list:
        return cast_floats(list(self.module.get_init_inputs()), self.dtype)

    def inputs(self, seed: int, device) -> list:
        """get_inputs() under the seed, drawn straight on the device (KernelBench files draw from the global
        generator; on a GPU this is far faster than drawing 6 GB on the host). A file whose get_inputs() cannot run
        with the device as the default (a CPU generator of its own, a host-only operator) is drawn on the host from
        then on, in every process that draws (the same failure, the same choice), and `host_draw` says why."""
        torch.manual_seed(seed)
        if self.host_draw is None and str(device) != "cpu":
            try:
                with torch.device(device):
                    xs = self.module.get_inputs()
            except torch.OutOfMemoryError:
                raise  # the GPU's memory, not the file: the plan and the stages say so
            except Exception as e:
                self.host_draw = (
                    f"get_inputs() raised {type(e).__name__} with {device} as the default device "
                    f"({first_line(e)[:120]}): inputs drawn on the host and moved"
                )
                torch.manual_seed(seed)
                xs = self.module.get_inputs()
        else:
            xs = self.module.get_inputs()
        return cast_floats([x.to(device) if isinstance(x, torch.Tensor) else x for x in xs], self.dtype)

    def case(self, name: str, seed: int, device) -> tuple[list, list]:
        g = torch.Generator().manual_seed(seed)
        init, xs = self.cases[name](g, device)
        return cast_floats(list(init), self.dtype), cast_floats(list(xs), self.dtype)

    def model(self, init, seed: int, device, train: bool = True) -> torch.nn.Module:
        """Model(*init) after the seed, every tensor it holds on `device` (plain tensor attributes too), in training
        mode (a fresh module's) or, with train=False, in eval mode."""
        from kp.judge.float64 import hold_on

        torch.manual_seed(seed)
        return hold_on(self.module.Model(*init), device, self.dtype).train(train)

    def footprint(self, device: str, train: bool = True) -> dict:
        """Bytes of the benchmark inputs, outputs and weights, and the reference's FLOPs (torch's FlopCounterMode),
        from a run on the meta device (nothing allocated); from one real call on `device` when the model cannot
        run on meta (an op without a meta kernel, a data-dependent shape). The model runs in the judge's mode
        (train=False: eval), where a shape may be one it takes in one mode only (a BatchNorm's batch of one)."""
        key = self._footprint_key(device, train)
        cached = _footprints_read(key)
        if cached is not None:
            return cached
        try:
            fp = self._meta_footprint(train)
        except Exception:
            try:
                fp = self._footprint(device, train)
            except torch.OutOfMemoryError:
                raise
            except Exception as e:  # the reference's own defect: a usage error, not the judge's traceback
                raise ReferenceRaised(
                    f"{self.name}: the reference itself raised on its own inputs (one forward on "
                    f"{device}, to measure its footprint)",
                    e,
                ) from None
        _footprints_write(key, fp)
        return fp

    def _footprint_key(self, device: str, train: bool = True) -> str | None:
        """What a footprint depends on: the file's text, its module-level values now (a smaller shape of the family
        changes them: scale_to_fit), the precision, the mode, torch's version and, for the fallback run, the device.
        None where the file cannot be read (nothing is kept then)."""
        try:
            text = Path(self.module.__file__).read_bytes()
        except (OSError, TypeError, AttributeError):
            return None
        plain = sorted(
            (k, repr(v))
            for k, v in vars(self.module).items()
            if not k.startswith("__") and isinstance(v, (int, float, bool, str, tuple))
        )
        key = (text, plain, self.dtype, torch.__version__, device) + (() if train else ("eval",))
        return hashlib.sha256(repr(key).encode()).hexdigest()[:32]

    def _meta_footprint(self, train: bool = True) -> dict:
        return self._footprint("meta", train)

    def made_on(self, device: str, train: bool = True) -> tuple[list, torch.nn.Module]:
        """get_inputs() and the Model as the judge makes them (precision, mode: as model() makes it), under seed 0,
        on `device` (meta: nothing allocated). Call it inside `with torch.device(device)`."""
        from kp.judge.float64 import hold_on

        torch.manual_seed(0)
        xs = cast_floats(self.module.get_inputs(), self.dtype)
        return xs, hold_on(self.module.Model(*self.init()), device, self.dtype).train(train)

    def _footprint(self, device: str, train: bool = True) -> dict:
        nbytes = lambda ts: sum(t.numel() * t.element_size() for t in ts if isinstance(t, torch.Tensor))
        with torch.device(device):
            xs, m = self.made_on(device, train)
            counter = FlopCount()
            weights = nbytes(list(m.parameters()) + list(m.buffers()))
            with counter, torch.no_grad(), LivePeak(nbytes(xs) + weights) as live:
                out = m(*xs)
        return {
            "shapes": ", ".join("x".join(map(str, t.shape)) for t in xs if isinstance(t, torch.Tensor)),
            "inputs": nbytes(xs),
            "outputs": nbytes(_as_list(out)),
            "weights": weights,
            "flops": int(counter.get_total_flops()),
            "peak": live.peak,
            "rows": batch_rows(list(xs)),
            "float_bytes": max(
                (t.element_size() for t in xs if isinstance(t, torch.Tensor) and t.is_floating_point()), default=4
            ),
        }

    def traffic(self, inputs, init, fp: dict, opts: dict | None = None) -> dict:
        """Fewest bytes and FLOPs of one call: the file's own `traffic` when it has one, else the unique bytes of
        inputs, outputs and weights and the FLOPs counted on the reference."""
        if hasattr(self.module, "traffic"):
            return self.module.traffic(*inputs, init=init, **(opts or {}))
        return {"bytes": fp["inputs"] + fp["outputs"] + fp["weights"], "flops": fp["flops"]}


# A footprint on the meta device costs a process its first meta operators' imports (sympy, torch._dynamo: about 2 s
# on a small job); the same file at the same sizes has the same footprint, kept here between runs.
def _footprints_dir() -> Path:
    from kp.box.builds import cache_root

    return cache_root() / "footprints"


def _footprints_read(key: str | None) -> dict | None:
    if key is None:
        return None
    try:
        return json.loads((_footprints_dir() / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None


def _footprints_write(key: str | None, fp: dict) -> None:
    if key is None:
        return
    try:
        d = _footprints_dir()
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f"{key}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(fp))
        os.replace(tmp, d / f"{key}.json")
    except OSError:
        pass  # a cache that cannot be written: the next run measures again


class LivePeak:
    """The most bytes alive at once during a forward (inputs and weights counted from the start): every operator's
    new outputs are added as they are made and taken off when freed, so a model whose intermediates dwarf its inputs
    and outputs (an attention block's L x L scores) shows it. Works on the meta device, where nothing is allocated."""

    def __init__(self, held: int = 0):
        self.live = self.peak = held

    def __enter__(self):
        outer = self

        class _Mode(EagerMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in out if isinstance(out, (tuple, list)) else [out]:
                    if isinstance(t, torch.Tensor) and not t._is_view():
                        outer._add(t, t.numel() * t.element_size())
                return out

        self.mode = _Mode()
        self.mode.__enter__()
        return self

    def _add(self, t, n: int) -> None:
        import weakref

        self.live += n
        self.peak = max(self.peak, self.live)
        weakref.finalize(t, self._free, n)

    def _free(self, n: int) -> None:
        self.live -= n

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)


def _as_list(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


# ---------------------------------------------------------------------------------------------------------------
# Pure helpers (no GPU, unit-tested in CI).


def trial_seeds(seed: int, n: int) -> list[int]:
    """Call i draws its inputs from seed + i: `--seed S` replays every call of a run that printed S."""
    return [(seed + i) % 2**32 for i in range(n)]


def describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"{type(x).__name__} {tuple(x.shape)} {x.dtype} {x.device}"
    if isinstance(x, (tuple, list)):
        return f"{type(x).__name__} of {len(x)}"
    return type(x).__name__


def state_map(ref_keys: list[tuple[str, tuple]], cand_keys: list[tuple[str, tuple]]) -> dict[str, str] | None:
    """Reference state_dict key -> candidate key, one for one, as a person porting the module would map them: by
    name when the names agree; else in order when the shapes line up (a renamed attribute); else by name where
    name and shape agree and the rest by shape, in order among equal shapes (a conv's weight kept as `weight`, its
    bias as `conv_bias`, registered in another order). None when no such mapping covers every key on both sides."""
    if {k: s for k, s in ref_keys} == {k: s for k, s in cand_keys}:
        return {k: k for k, _ in ref_keys}
    if len(ref_keys) != len(cand_keys):
        return None
    if all(a[1] == b[1] for a, b in zip(ref_keys, cand_keys)):
        return {a[0]: b[0] for a, b in zip(ref_keys, cand_keys)}
    cand = dict(cand_keys)
    names = {k: k for k, s in ref_keys if cand.get(k) == s}
    left = [(k, s) for k, s in cand_keys if k not in names.values()]
    for k, s in ref_keys:
        if k not in names:
            i = next((i for i, (_, c) in enumerate(left) if c == s), None)
            if i is None:
                return None
            names[k] = left.pop(i)[0]
    return names


def partial_map(ref_keys: list[tuple[str, tuple]], cand_keys: list[tuple[str, tuple]]) -> dict[str, str]:
    """KernelBench's same-seed contract, where state_map finds no whole mapping: the reference keys the candidate
    has under the same name with the same shape (possibly none)."""
    cand = dict(cand_keys)
    return {k: k for k, s in ref_keys if cand.get(k) == s}


def unmapped(ref_keys: list[tuple[str, tuple]], cand_keys: list[tuple[str, tuple]], names: dict[str, str]) -> str:
    """What a partial mapping leaves out, with shapes: 'reference fc.weight (10, 5); candidate w_packed (50,)'."""
    used = set(names.values())
    fmt = lambda ks: (
        ", ".join(f"{k} {tuple(s)}" for k, s in ks[:4]) + (f" (+{len(ks) - 4} more)" if len(ks) > 4 else "")
    )
    ref_left = [(k, s) for k, s in ref_keys if k not in names]
    cand_left = [(k, s) for k, s in cand_keys if k not in used]
    parts = ([f"reference-only {fmt(ref_left)}"] if ref_left else []) + (
        [f"candidate-only {fmt(cand_left)}"] if cand_left else []
    )
    return "; ".join(parts)


def make_update(kind: str, model: torch.nn.Module, seed: int, only: set[str] | None = None) -> dict:
    """A change of the floating-point parameters, the way training makes one, as data both sides apply alike
    (`only`: the parameters every judged model maps; None: all)."""
    g = torch.Generator().manual_seed(seed)
    params = [
        (k, p)
        for k, p in model.named_parameters()
        if p.is_floating_point() and p.numel() and (only is None or k in only)
    ]
    if not params:
        return {}
    size = update_size(params[0][1].dtype)

    def noise(p):
        scale = float(p.detach().abs().mean()) or 1.0
        return (torch.randn(p.shape, generator=g, dtype=torch.float32) * scale).to(p.device, p.dtype)

    if kind == "optimizer step":  # SGD, lr `size`, on random gradients of each parameter's scale
        return {"kind": kind, "lr": size, "grads": {k: noise(p) for k, p in params}}
    if kind == "load_state_dict":  # new values for every parameter, loaded with load_state_dict(strict=False)
        return {"kind": kind, "state": {k: p.detach() + size * noise(p) for k, p in params}}
    k, p = max(params, key=lambda kp: kp[1].numel())  # in place, under no_grad, on the largest parameter
    return {"kind": kind, "name": k, "delta": size * noise(p)}


def rename_update(update: dict, names: dict[str, str]) -> dict:
    out = dict(update)
    if "grads" in update:
        out["grads"] = {names[k]: v for k, v in update["grads"].items()}
    if "state" in update:
        out["state"] = {names[k]: v for k, v in update["state"].items()}
    if "name" in update:
        out["name"] = names[update["name"]]
    return out


def load_state(model: torch.nn.Module, state: dict) -> None:
    """load_state_dict, as far as the keys go. A module whose tensors were made as inference tensors (built inside
    torch.inference_mode(), which a user's process never loads a state into) refuses an in-place copy outside that
    mode: the same copy is made inside it, where PyTorch allows it."""
    try:
        model.load_state_dict(state, strict=False)
    except RuntimeError as e:
        if "nference tensor" not in str(e):
            raise
        with torch.inference_mode():
            model.load_state_dict(state, strict=False)


def _mode_of(p: torch.Tensor):
    """Where an in-place change of `p` is allowed: inside torch.inference_mode() for a tensor made as an inference
    tensor, as it is for any other."""
    return torch.inference_mode() if p.is_inference() else contextlib.nullcontext()


def apply_update(model: torch.nn.Module, update: dict) -> None:
    """What the reference and every judged model do with an update (the same code on both sides)."""
    if not update:
        return
    if update["kind"] == "optimizer step":  # plain SGD's step, p -= lr * grad in place, as torch.optim.SGD takes it;
        with torch.no_grad():  # not through torch.optim, whose first optimizer in a process imports torch._dynamo
            for k, grad in update["grads"].items():  # (1-4 s in every fresh worker, a level-2 job's parity doubled)
                p = model.get_parameter(k)
                with _mode_of(p):
                    p.add_(grad.to(p.device), alpha=-update["lr"])
    elif update["kind"] == "load_state_dict":
        load_state(model, update["state"])
    else:
        p = model.get_parameter(update["name"])
        with torch.no_grad(), _mode_of(p):
            p.add_(update["delta"])


def problem_inputs(problem: str, device="cuda", seed: int = 0) -> list:
    """A built-in problem's get_inputs() drawn straight on `device` (a notebook's way in: the 6 GB softmax input is
    never built on the host). Without a GPU: one UsageError line saying what is missing, before anything is drawn."""
    if str(device).startswith("cuda"):
        require_gpu()
    return Reference.load(("problem", problem)).inputs(seed, device)
