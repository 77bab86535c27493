"""The judge's own cases: the known-wrong candidates of the built-in problems (tests/wrong) and the references with
their candidates (tests/judge_cases), each file's declarations read without importing it."""

import ast
import shutil
from pathlib import Path

import harness

WRONG = sorted((harness.ROOT / "tests" / "wrong").glob("*.py"))


CASES_DIR = harness.ROOT / "tests" / "judge_cases"


def meta(path: Path) -> dict:
    """PROBLEM / EXPECT / KIND / SAYS / DEVICES / FLAGS / NEEDS (modules it imports beyond the requirements) /
    BENCH_SHAPE of a candidate file, read without importing it into the test process. EXPECT: a rejection's reason
    must match it (None: the candidate must be accepted); SAYS: what an acceptance's verdict line must match, where
    the label is the point (a library's kernels named); KIND: the failure kind the rejection must carry
    (kp.errors.FAILURE_KINDS);
    BENCH_SHAPE: why a known-wrong case is judged at its problem's benchmark shape on the GPU (None: at the problem's
    TEST_SIZES, `--at test`, which shows every other case's defect as well)."""
    out = {"FLAGS": (), "NEEDS": (), "KIND": None, "SAYS": None, "BENCH_SHAPE": None}
    names = ("PROBLEM", "EXPECT", "KIND", "SAYS", "DEVICES", "FLAGS", "NEEDS", "BENCH_SHAPE")
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in names:
                out[node.targets[0].id] = ast.literal_eval(node.value)
    return out


# Every (reference folder, candidate file) pair of tests/judge_cases: the kinds of problem at the top, and under
# contract/ what real machine-written candidates showed about KernelBench's contract.
PAIRS = [
    (str(r.parent.relative_to(CASES_DIR)), c.name)
    for r in sorted(CASES_DIR.glob("**/ref.py"))
    # _x.py: a helper candidates import
    for c in sorted(r.parent.glob("*.py"))
    if c.name != "ref.py" and not c.name.startswith("_")
]


def missing(needs) -> list[str]:
    """The modules of a case's NEEDS that do not import here: absent, or installed but broken (a compiler package
    built against another numpy fails at its import)."""
    import importlib

    out = []
    for name in needs:
        try:
            importlib.import_module(name)
        except Exception as e:
            out.append(f"{name} ({type(e).__name__})")
    return out


def outside_repo(tmp_path: Path, folder: str) -> Path:
    dst = tmp_path / folder
    shutil.copytree(CASES_DIR / folder, dst)
    return dst


def shipped_candidate(tmp_path: Path, problem: str, variant: str, opts: dict) -> Path:
    """A KernelBench-format file outside the repo that wraps a shipped variant (imports the playground)."""
    f = tmp_path / f"cand_{problem}_{variant}.py"
    f.write_text(
        f"from models.{problem} import ModelNew as _Shipped\n\n\n"
        f"class ModelNew(_Shipped):\n"
        f"    def __init__(self, *args):\n"
        f"        super().__init__(*args, variant={variant!r}, **{opts!r})\n"
    )
    return f
