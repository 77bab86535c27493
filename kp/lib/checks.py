"""The CPU-side checks CI runs on every .cu, with no GPU: nvcc -c with the shipped build's flags for each
architecture a source claims, and its generated binding through g++ (many sources in one g++ run)."""

from __future__ import annotations

import re
import subprocess
import sysconfig
from pathlib import Path

from kp.lib.build import arch_flag, build_flags, parse_arch
from kp.errors import KernelBuildError
from kp.lib.sources import EXPERIMENTS_RE, binding_source, local_headers, parse_exports


def has_experiments(path: Path) -> bool:
    """Whether the source or a local header it includes has `#if KP_EXPERIMENTS` blocks (A/B hooks, traces)."""
    return any(re.search(EXPERIMENTS_RE.pattern, f.read_text(), re.M) for f in [Path(path), *local_headers(Path(path))])


def compile_check(
    path: Path,
    out_dir: Path,
    archs: tuple[str, ...] | list[str] = ("sm_90a",),
    experiments: bool = False,
    optimise: bool = True,
    host: bool = True,
) -> tuple[bool, str]:
    """nvcc -c for the given architectures ('sm_XY[a]' names) in one invocation (device passes in parallel), with
    the shipped build's flags (experiments: the bench scripts' build, A/B hooks compiled in). The plain targets
    share one PTX (the lowest) with SASS for each of them, which is what a portable build runs on those GPUs; an
    'a' target gets its own pass. optimise=False: the device passes at -O0 (cicc and ptxas), which still parse,
    type-check, lower and assemble every line for the target and check its resources, in half the time; what
    only the optimiser can fail on is left to the real build. host=False (one architecture): the device side alone
    to a cubin, without the host compiler's pass and cudafe++'s split; the device front end still parses and
    type-checks every host function of the file (an undefined name or a missing member in a launch wrapper fails
    there too), what is left out is the host compiler's own diagnostics, in a third of the time."""
    from torch.utils.cpp_extension import include_paths

    flags = build_flags(parse_arch(archs[0]), experiments)
    plain = sorted((parse_arch(a) for a in archs if not a.endswith("a")))
    gencodes = [arch_flag(parse_arch(a)) for a in archs if a.endswith("a")]
    if plain:
        sass = ",".join(f"sm_{M}{m}" for M, m in plain)
        gencodes.append(f"-gencode=arch=compute_{plain[0][0]}{plain[0][1]},code=[{sass}]")
    cuda_flags = [f for f in flags["cuda_cflags"] if not f.startswith("-gencode")] + gencodes + ["--threads", "0"]
    if not optimise:
        cuda_flags += ["-Xcicc", "-O0", "-Xptxas", "-O0"]
    py_inc = sysconfig.get_paths()["include"]
    incs = [f"-I{p}" for p in include_paths()] + [f"-I{py_inc}"] + [f"-I{p}" for p in flags["include_paths"]]
    obj = out_dir / (
        path.parent.name + "__" + path.stem + ("_experiments" if experiments else "") + (".o" if host else ".cubin")
    )
    if not host and len(archs) != 1:
        raise ValueError("a device-only check builds one cubin: one architecture")
    mode = ["-c", str(path), "-o", str(obj), "-Xcompiler", "-fPIC"] if host else ["-cubin", str(path), "-o", str(obj)]
    cmd = ["nvcc", *mode, "-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE"] + cuda_flags + incs
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.returncode == 0, (r.stdout + r.stderr)


def binding_check_many(paths: list[Path], out_dir: Path, experiments: bool = False) -> dict[Path, tuple[bool, str]]:
    """g++ -fsyntax-only on the generated bindings (the KP_EXPORT signatures and their registrations agree), for
    many sources in one g++ run (the torch headers are parsed once): each generated binding
    goes into its own header, inside its own namespace, and a compiler message is charged to the header it names.
    experiments: the exports of the bench scripts' build (A/B hooks included)."""
    from torch.utils.cpp_extension import include_paths

    out: dict[Path, tuple[bool, str]] = {}
    headers: dict[Path, Path] = {}
    for i, path in enumerate(paths):
        try:
            body = binding_source(f"kp_check_{i}", parse_exports(path.read_text(), str(path), experiments))
        except KernelBuildError as e:
            out[path] = (False, str(e))
            continue
        body = "\n".join(line for line in body.splitlines() if not line.startswith("#include"))
        h = out_dir / f"{path.parent.name}__{path.stem}_binding.h"
        h.write_text(f"namespace kp_check_{i} {{\n{body}\n}}\n")
        headers[path] = h
    main = out_dir / "all_bindings.cpp"
    main.write_text(
        "#include <torch/library.h>\n#include <ATen/core/TensorBase.h>\n"
        + "".join(f'#include "{h}"\n' for h in headers.values())
    )
    cmd = ["g++", "-fsyntax-only", build_flags(None)["cflags"][1], str(main)] + [f"-I{p}" for p in include_paths()]
    r = subprocess.run(cmd, capture_output=True, text=True)
    log = r.stdout + r.stderr
    for path, h in headers.items():
        mine = [ln for ln in log.splitlines() if ln.startswith(str(h))]
        bad = any(" error" in ln for ln in mine) or (
            r.returncode != 0 and not any(ln.startswith(str(hh)) for hh in headers.values() for ln in log.splitlines())
        )
        out[path] = (not bad, "\n".join(mine) or log)
    return out


def check_rungs(rungs: list, jobs: int | None = None) -> int:
    """Every rung compiled by nvcc for each architecture its `Requires` line claims, several at once, nothing linked
    or loaded (`run.py --build` without a GPU, as CI does); each said on stderr as it ends, a failure's compiler
    output after. Returns 1 if any failed, else 0."""
    import concurrent.futures as cf
    import os
    import shutil
    import sys
    import tempfile
    import time

    out = Path(tempfile.mkdtemp(prefix="kp_check_"))
    t0 = time.perf_counter()
    print(
        f"no GPU: compile-checking {len(rungs)} rungs with nvcc for the architectures each claims (nothing is "
        f"linked or run)",
        file=sys.stderr,
    )

    def one(r):
        archs = r.claimed_archs()
        ok, log = compile_check(r.path, out, archs)
        print(f"{r.problem}/{r.name} ({' '.join(archs)}): {'ok' if ok else 'FAILED'}", file=sys.stderr, flush=True)
        return r, ok, log

    with cf.ThreadPoolExecutor(max_workers=max(1, jobs or (os.cpu_count() or 1))) as ex:
        res = list(ex.map(one, rungs))
    bad = [(r, log) for r, ok, log in res if not ok]
    for r, log in bad:
        print(f"{r.path}:\n{log[-4000:]}", file=sys.stderr)
    shutil.rmtree(out, ignore_errors=True)
    print(f"compile-checked {len(res) - len(bad)}/{len(res)} rungs in {time.perf_counter() - t0:.1f} s wall")
    return 1 if bad else 0
