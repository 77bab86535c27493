"""What models/ and a notebook import: one name space over the playground's pieces, each in a module of its own.

    kp/lib/registry.py   the filesystem as the list of problems and rungs; what each rung needs (GPU architecture)
    kp/lib/sources.py    what a .cu exports and includes, read without compiling it
    kp/lib/build.py      compile on first use and cache by content hash
    kp/lib/checks.py     the CPU-side compile checks CI runs on every .cu
    kp/lib/layers.py     helpers ModelNew classes share (weight-derived caches, IEEE fp32 GEMMs, input checks)
    kp/lib/numerics.py   relative L2 error against float64, bitwise equality through views, the error budget
    kp/lib/timing.py     CUDA-event timing behind an L2 flush, interleaved; the copy and GEMM ceilings
    kp/judge/reference.py, kp/worker/loop.py, kp/judge/driver.py, kp/observe/report.py, kp/observe/verdict.py
                         the judge (run.py), its table and its verdict line

Nothing under kp/ imports this file.
"""

from kp.lib.build import (
    Built,
    Kernel,
    arch_flag,
    build,
    build_all,
    build_flags,
    build_path,
    cache_key,
    cache_root,
    parse_arch,
    progress,
    require_gpu,
    summarize_build_error,
)
from kp.lib.checks import binding_check_many, compile_check, has_experiments
from kp.lib.sources import Export, binding_source, local_headers, parse_exports, strip_experiments
from kp.errors import KernelBuildError, UsageError
from kp.lib.layers import (
    GEMM_MODES,
    DerivedCache,
    LinearGemm,
    check_input,
    ieee_fp32,
    mm_fp32,
    set_precision,
    tf32_matmul,
    trained,
)
from kp.lib.registry import PRECISIONS
from kp.lib.numerics import ABS_FLOOR, HALF_DTYPES, REF_MULTIPLE, Err, budget_from, clone_layout, rel_error, same_values
from kp.judge.reference import problem_inputs as inputs
from kp.lib.registry import (
    KERNELS,
    MODELS,
    PROBES,
    ROOT,
    capability,
    default_rung,
    first_runnable,
    kernel_sources,
    picks_per_call,
    problem_module,
    problems,
    read_rung,
    required_exports,
    rung,
    runnable_variants,
    runs_here,
    variants,
)
from kp.lib.timing import HOLD_CYCLES, L2Flusher, Timing, bench_interleaved, copy_bandwidth, gemm_rates, summarize

__all__ = [
    "Built",
    "Export",
    "Kernel",
    "arch_flag",
    "binding_check_many",
    "binding_source",
    "build",
    "build_all",
    "build_flags",
    "build_path",
    "cache_key",
    "cache_root",
    "compile_check",
    "has_experiments",
    "local_headers",
    "parse_arch",
    "parse_exports",
    "progress",
    "require_gpu",
    "strip_experiments",
    "summarize_build_error",
    "KernelBuildError",
    "UsageError",
    "GEMM_MODES",
    "PRECISIONS",
    "DerivedCache",
    "LinearGemm",
    "check_input",
    "ieee_fp32",
    "mm_fp32",
    "set_precision",
    "tf32_matmul",
    "trained",
    "ABS_FLOOR",
    "REF_MULTIPLE",
    "Err",
    "budget_from",
    "clone_layout",
    "rel_error",
    "same_values",
    "inputs",
    "KERNELS",
    "MODELS",
    "PROBES",
    "ROOT",
    "capability",
    "default_rung",
    "first_runnable",
    "kernel_sources",
    "picks_per_call",
    "problem_module",
    "problems",
    "read_rung",
    "required_exports",
    "rung",
    "runnable_variants",
    "runs_here",
    "variants",
    "HOLD_CYCLES",
    "L2Flusher",
    "Timing",
    "bench_interleaved",
    "copy_bandwidth",
    "gemm_rates",
    "summarize",
]
