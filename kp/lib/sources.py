"""What the playground reads from a kernel source without compiling it: its exports (`KP_EXPORT void name(params)`
becomes torch.ops.<module>.<name>) and the binding generated for them, its `#if KP_EXPERIMENTS` blocks (A/B hooks,
traces, stripped from a shipped build), and the local headers it includes (part of its cache key)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from kp.errors import KernelBuildError
from kp.lib.registry import KERNELS

# ---------------------------------------------------------------------------------------------------------------
# Exports: `KP_EXPORT void name(params)` in a .cu becomes torch.ops.<module>.<name>.

_EXPORT_RE = re.compile(r"^KP_EXPORT\s+void\s+(\w+)\s*\(([^)]*)\)", re.M)
_PARAM_TYPES = {  # C++ parameter type in the .cu -> type in the generated wrapper (what the dispatcher accepts)
    "const at::TensorBase&": "const at::Tensor&",
    "int64_t": "int64_t",
    "double": "double",
    "bool": "bool",
}


@dataclasses.dataclass(frozen=True)
class Export:
    name: str
    params: tuple[tuple[str, str], ...]  # (C++ type, name)


_IF_RE = re.compile(r"^\s*#\s*if(n?def)?\b")
_ENDIF_RE = re.compile(r"^\s*#\s*endif\b")
EXPERIMENTS_RE = re.compile(r"^\s*#\s*if\s+KP_EXPERIMENTS\b")


def strip_experiments(src: str) -> str:
    """The source as the shipped build sees it: `#if KP_EXPERIMENTS ... #endif` blocks (A/B hooks) removed."""
    out, depth = [], 0  # depth > 0: inside an experiments block (counting nested #if's)
    for line in src.splitlines():
        if depth:
            depth += 1 if _IF_RE.match(line) else -1 if _ENDIF_RE.match(line) else 0
            continue
        if EXPERIMENTS_RE.match(line):
            depth = 1
            continue
        out.append(line)
    return "\n".join(out)


def parse_exports(src: str, where: str = "<source>", experiments: bool = False) -> list[Export]:
    """The KP_EXPORT functions of a .cu (those under `#if KP_EXPERIMENTS` only when experiments is set)."""
    if not experiments:
        src = strip_experiments(src)
    out = []
    for m in _EXPORT_RE.finditer(src):
        params = []
        for raw in filter(None, (p.strip() for p in m.group(2).split(","))):
            pm = re.fullmatch(r"(.+?)\s*(\w+)", raw)
            ctype = re.sub(r"\s+", " ", pm.group(1)).replace(" &", "&").strip() if pm else raw
            if not pm or ctype not in _PARAM_TYPES:
                raise KernelBuildError(
                    f"{where}: KP_EXPORT {m.group(1)}: unsupported parameter {raw!r} "
                    f"(allowed types: {', '.join(_PARAM_TYPES)})"
                )
            params.append((ctype, pm.group(2)))
        out.append(Export(m.group(1), tuple(params)))
    if not out:
        raise KernelBuildError(f"{where}: no `KP_EXPORT void name(...)` function found")
    return out


def binding_source(module: str, exports: list[Export]) -> str:
    """The host-side registration, compiled by g++ with only <torch/library.h> (~6 s)."""
    lines = ["#include <torch/library.h>", "#include <ATen/core/TensorBase.h>", ""]
    for e in exports:
        decl = ", ".join(f"{t} {n}" for t, n in e.params)
        wrap = ", ".join(f"{_PARAM_TYPES[t]} {n}" for t, n in e.params)
        args = ", ".join(n for _, n in e.params)
        lines += [f"void {e.name}({decl});", f"static void {e.name}__kp({wrap}) {{ {e.name}({args}); }}"]
    lines += ["", f"TORCH_LIBRARY({module}, m) {{"]
    lines += [f'  m.def("{e.name}", &{e.name}__kp);' for e in exports]
    lines += ["}", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# Cache key.

_INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def local_headers(path: Path) -> list[Path]:
    """Every quoted include reachable from `path` that resolves to a file in this repo, transitively."""
    seen: dict[Path, None] = {}
    todo = [path.resolve()]
    while todo:
        cur = todo.pop()
        for inc in _INCLUDE_RE.findall(cur.read_text()):
            for base in (cur.parent, KERNELS):
                cand = (base / inc).resolve()
                if cand.is_file():
                    if cand not in seen and cand != path.resolve():
                        seen[cand] = None
                        todo.append(cand)
                    break
    return sorted(seen)
