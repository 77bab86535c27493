"""`pip install -e .` (pyproject.toml): what it installs imports from anywhere, and its `kp` command is run.py's."""

import importlib
import tomllib

from conftest import ROOT


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_kp_command_is_run_pys_entry():
    target = _project()["project"]["scripts"]["kp"]
    module, name = target.split(":")
    entry = getattr(importlib.import_module(module), name)
    import run

    assert entry is run.entry


def test_every_package_and_top_module_is_installed():
    """Each top-level package of the checkout (a folder with an __init__.py) is matched by the packages' include, and
    the modules a notebook imports (harness, run) are listed, so `import kp`, `import harness` and `from models.softmax
    import ModelNew` work from any folder."""
    tool = _project()["tool"]["setuptools"]
    include = [p.rstrip("*") for p in tool["packages"]["find"]["include"]]
    checkout_only = {"tools", "bench"}  # run from the checkout (python -m tools.gpu_tests): names too plain to install
    packages = sorted(p.parent.name for p in ROOT.glob("*/__init__.py") if p.parent.name not in checkout_only)
    assert packages and all(any(p.startswith(i) for i in include) for p in packages), packages
    assert {"harness", "run"} <= set(tool["py-modules"])


def test_the_dependencies_are_the_requirements():
    reqs = {ln.split("#")[0].strip() for ln in (ROOT / "requirements.txt").read_text().splitlines()} - {""}
    deps = set(_project()["project"]["dependencies"]) | set(_project()["project"]["optional-dependencies"]["test"])
    assert deps == reqs, deps ^ reqs
