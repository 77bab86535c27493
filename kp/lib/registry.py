"""The registry: the filesystem is the list. A problem exists because ``models/<id>.py`` exists; its rungs (variants)
are the ``kernels/<id>/*.cu`` files, and each rung's header says what it needs:

    // Requires: sm_80     runs on compute capability 8.0 and newer (built for the GPU it runs on)
    // Requires: sm_90a    Hopper-only features (clusters, TMA, wgmma, programmatic launch): compute capability 9.0
    // Record: <why>       kept as a record of a design that lost; run only when asked (--variant all)
    // Precisions: fp32 bf16 fp16   the run.py precisions the rung takes (default: fp32 and tf32, float32 tensors)

A rung without a Requires line is taken to need sm_90a (the safe reading). ``KP_CAPABILITY=8.0`` makes this process
behave as on a GPU of that capability (rung choice, build target with PTX the real GPU can JIT): the way to exercise
the non-Hopper path on a Hopper machine.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import re
from pathlib import Path

from kp.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "kernels"
MODELS = ROOT / "models"
PROBES = ROOT / "tools" / "probes"
# the judge's own GPU code (kp.judge.sanitize's shared-memory fill)
JUDGE_KERNELS = ROOT / "kp" / "kernels"
# The architectures CI compiles each portable rung for (Ampere, Ada, Hopper); Hopper-only rungs get sm_90a only.
CI_ARCHS = ("sm_80", "sm_89", "sm_90a")

_REQUIRES_RE = re.compile(r"^//\s*Requires:\s*sm_(\d)(\d)(a?)\b", re.M)
_RECORD_RE = re.compile(r"^//\s*Record:\s*(.+)$", re.M)
_PRECISIONS_RE = re.compile(r"^//\s*Precisions:\s*(.+)$", re.M)
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")  # the judged modes (kp.lib.numerics.PRECISION_DTYPES)
FLOAT32_PRECISIONS = ("fp32", "tf32")  # a rung without a Precisions line: float32 tensors (tf32 changes the GEMM only)


def problems() -> list[str]:
    return sorted(p.stem for p in MODELS.glob("*.py") if not p.stem.startswith("_"))


def variants(problem: str) -> list[str]:
    """Every rung file of a problem (records included)."""
    return sorted(p.stem for p in (KERNELS / problem).glob("*.cu"))


@dataclasses.dataclass(frozen=True)
class Rung:
    problem: str
    name: str
    path: Path
    min_capability: tuple[int, int]
    arch_specific: bool  # an 'a' target: that exact capability only
    record: str | None  # why it is kept, for a rung that lost; None for a rung of the ladder
    precisions: tuple[str, ...] = FLOAT32_PRECISIONS  # the run.py precisions it takes (its Precisions line)

    @property
    def requires(self) -> str:
        major, minor = self.min_capability
        return f"sm_{major}{minor}{'a' if self.arch_specific else ''}"

    def runs_on(self, cap: tuple[int, int] | None) -> bool:
        """Whether this rung runs on a GPU of capability `cap` (None: no GPU, nothing runs; callers that only need
        to know what exists use variants())."""
        if cap is None:
            return False
        return cap == self.min_capability if self.arch_specific else cap >= self.min_capability

    def claimed_archs(self) -> list[str]:
        """The targets CI compiles this rung for."""
        if self.arch_specific:
            return [self.requires]
        return [a for a in CI_ARCHS if (int(a[3]), int(a[4])) >= self.min_capability]

    def why_not(self, cap: tuple[int, int] | None) -> str:
        have = "no CUDA GPU" if cap is None else f"this GPU has compute capability {cap[0]}.{cap[1]}"
        need = (
            f"compute capability {self.min_capability[0]}.{self.min_capability[1]} exactly"
            if self.arch_specific
            else f"compute capability {self.min_capability[0]}.{self.min_capability[1]} or newer"
        )
        return f"{self.problem}/{self.name} needs {self.requires} ({need}); {have}"


def read_rung(path: Path, problem: str | None = None) -> Rung:
    head = "\n".join(Path(path).read_text().splitlines()[:120])
    m = _REQUIRES_RE.search(head)
    cap, specific = ((int(m.group(1)), int(m.group(2))), bool(m.group(3))) if m else ((9, 0), True)
    rec = _RECORD_RE.search(head)
    prec = _PRECISIONS_RE.search(head)
    return Rung(
        problem or Path(path).parent.name,
        Path(path).stem,
        Path(path),
        cap,
        specific,
        rec.group(1).strip() if rec else None,
        tuple(prec.group(1).split()) if prec else FLOAT32_PRECISIONS,
    )


def rung(problem: str, name: str) -> Rung:
    path = KERNELS / problem / f"{name}.cu"
    if not path.is_file():
        raise UsageError(f"no variant {name!r} for {problem!r}; variants: {', '.join(variants(problem))}")
    return read_rung(path, problem)


@functools.lru_cache(maxsize=None)
def capability() -> tuple[int, int] | None:
    """The compute capability rungs are chosen and built for: KP_CAPABILITY (e.g. "8.0") when set, else the current
    GPU's; None without a CUDA GPU."""
    forced = os.environ.get("KP_CAPABILITY")
    if forced:
        m = re.fullmatch(r"\s*(\d+)\.(\d)\s*", forced)
        if not m:
            raise UsageError(f"KP_CAPABILITY must look like 8.0 or 9.0, got {forced!r}")
        return int(m.group(1)), int(m.group(2))
    import torch

    return torch.cuda.get_device_capability() if torch.cuda.is_available() else None


def runnable_variants(problem: str, include_records: bool = False, precision: str | None = "fp32") -> list[str]:
    """The rungs that run on this GPU in this precision (their Precisions line; None: in any): the ladder (the path
    to the default), and with include_records the rungs kept as records too."""
    cap = capability()
    out = []
    for v in variants(problem):
        r = rung(problem, v)
        takes = precision is None or precision in r.precisions
        if r.runs_on(cap) and (include_records or r.record is None) and takes:
            out.append(v)
    return out


def runs_here(problem: str, variant: str) -> bool:
    """Whether a rung runs on this GPU (False without one)."""
    return rung(problem, variant).runs_on(capability())


def first_runnable(problem: str, preferred: list[str]) -> str:
    """The first rung of `preferred` that runs on this GPU (the last one when there is no GPU, so a CPU-only
    process can still construct a model)."""
    cap = capability()
    for v in preferred:
        if rung(problem, v).runs_on(cap):
            return v
    return preferred[-1]


def default_rung(problem: str) -> str:
    """The rung a plain ``ModelNew()`` runs: the model's DEFAULT_VARIANT, which is a rung name, or a tuple of rung
    names in order of preference (the first that runs on this GPU), or "auto" (the model picks per call)."""
    d = getattr(problem_module(problem), "DEFAULT_VARIANT", None)
    if isinstance(d, (tuple, list)):
        return first_runnable(problem, list(d))
    if d is None:
        raise UsageError(f"models/{problem}.py declares no DEFAULT_VARIANT")
    return d


def picks_per_call(problem: str) -> bool:
    """Whether the model's default is "auto": its ModelNew picks a rung per call (a row of its own in the table)."""
    return getattr(problem_module(problem), "DEFAULT_VARIANT", None) == "auto"


def kernel_sources() -> list[Path]:
    """Every .cu of every problem, the measurement probes and the judge's own kernels (CI compiles each of them)."""
    return sorted(KERNELS.glob("*/*.cu")) + sorted(PROBES.glob("*.cu")) + sorted(JUDGE_KERNELS.glob("*.cu"))


def problem_module(problem: str):
    if problem not in problems():
        raise UsageError(f"unknown problem {problem!r}; problems: {', '.join(problems())}")
    return importlib.import_module(f"models.{problem}")


def required_exports(problem: str) -> tuple[str, ...]:
    """The KP_EXPORT names every rung of a problem must provide: the model's EXPORTS."""
    return tuple(getattr(problem_module(problem), "EXPORTS", ()))


def variant_factory(mod, variant: str, opts: dict, precision: str):
    """How a built-in row's model is made: the problem's ModelNew with the rung, the row's options and, in tf32,
    the precision judged (the judge's rows and the ncu process's are made alike); in bf16 and fp16 the inputs and
    weights carry their dtype, as for any model."""
    o = {**opts, **({"precision": precision} if precision in FLOAT32_PRECISIONS and precision != "fp32" else {})}
    return lambda *init: mod.ModelNew(*init, variant=variant, **o)
