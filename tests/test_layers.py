"""kp/'s modules import only modules before them in kp.LAYER_ORDER: no circle, nothing upward (function-level
imports included), and every module of kp/ has its place."""
import ast
from pathlib import Path

import kp

KP = Path(kp.__file__).parent


def _imports(path: Path) -> set[str]:
    out = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.ImportFrom) and n.module and (n.module == "kp" or n.module.startswith("kp.")):
            parts = n.module.split(".")
            out |= {parts[1]} if len(parts) > 1 else {a.name for a in n.names}
        elif isinstance(n, ast.Import):
            out |= {a.name.split(".")[1] for a in n.names if a.name.startswith("kp.")}
    return out - {path.stem}


def test_every_module_has_a_layer():
    mods = {p.stem for p in KP.glob("*.py")} - {"__init__"}
    assert mods == set(kp.LAYER_ORDER), (sorted(mods - set(kp.LAYER_ORDER)), sorted(set(kp.LAYER_ORDER) - mods))


def test_imports_follow_the_layer_order():
    rank = {m: i for i, m in enumerate(kp.LAYER_ORDER)}
    upward = [f"kp/{p.name} imports kp.{m}" for p in sorted(KP.glob("*.py")) if p.stem in rank
              for m in sorted(_imports(p)) if m in rank and rank[m] >= rank[p.stem]]
    assert not upward, upward


def test_the_check_sees_an_import_inside_a_function(tmp_path):
    f = tmp_path / "timing.py"
    f.write_text("def f():\n    from kp.judge import Judge\n    import kp.batch\n")
    assert _imports(f) == {"judge", "batch"}
