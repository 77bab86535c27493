"""kp/'s modules import only modules before them in kp.LAYER_ORDER: no circle, nothing upward (function-level
imports included), and every module of kp/ has its place."""

import ast
from pathlib import Path

import kp

KP = Path(kp.__file__).parent


def _modules() -> dict[str, Path]:
    """Every module of kp/ by its dotted name under kp ('judge.worker'); package __init__ files hold no code."""
    return {
        ".".join(p.relative_to(KP).with_suffix("").parts): p
        for p in sorted(KP.rglob("*.py"))
        if p.name != "__init__.py"
    }


def _imports(path: Path, known: set[str]) -> set[str]:
    """The kp modules `path` imports, by dotted name: `from kp.lib.build import x`, `from kp.judge import worker`,
    `import kp.lib.timing`, anywhere in the file."""
    out = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.ImportFrom) and n.module and (n.module == "kp" or n.module.startswith("kp.")):
            base = n.module[3:]
            if base in known:
                out.add(base)
            else:
                out |= {f"{base}.{a.name}".lstrip(".") for a in n.names} & known
        elif isinstance(n, ast.Import):
            out |= {a.name[3:] for a in n.names if a.name.startswith("kp.")} & known
    return out


def test_every_module_has_a_layer():
    mods = set(_modules())
    assert mods == set(kp.LAYER_ORDER), (sorted(mods - set(kp.LAYER_ORDER)), sorted(set(kp.LAYER_ORDER) - mods))


def test_package_inits_hold_no_code():
    """A folder's __init__ says what the concern is and imports nothing: importing one module of it loads no other."""
    for p in KP.rglob("__init__.py"):
        body = [
            n
            for n in ast.parse(p.read_text()).body
            if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))
        ]
        assert p == KP / "__init__.py" or not body, p


def test_imports_follow_the_layer_order():
    mods = _modules()
    rank = {m: i for i, m in enumerate(kp.LAYER_ORDER)}
    upward = [
        f"kp.{name} imports kp.{m}"
        for name, p in mods.items()
        if name in rank
        for m in sorted(_imports(p, set(mods)))
        if m in rank and rank[m] >= rank[name] and m != name
    ]
    assert not upward, upward


def test_the_check_sees_an_import_inside_a_function(tmp_path):
    f = tmp_path / "timing.py"
    f.write_text(
        "def f():\n    from kp.judge.driver import Judge\n    import kp.batch.slots\n"
        "    from kp.judge import runners, plan\n"
    )
    assert _imports(f, set(_modules())) == {"judge.driver", "batch.slots", "judge.runners", "judge.plan"}


def test_the_library_never_imports_its_command_line():
    """run.py is a shell over kp.command: no module of kp/ imports it (a warm judge's slot is handed the command
    line's runner by kp.command, the top of the order), so the library has no loop through its front door."""
    for name, path in _modules().items():
        for n in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in n.names]
                if isinstance(n, ast.Import)
                else [n.module]
                if isinstance(n, ast.ImportFrom) and n.module
                else []
            )
            assert "run" not in names, f"kp/{name.replace('.', '/')}.py imports run.py"
    assert kp.LAYER_ORDER[-1] == "command"
