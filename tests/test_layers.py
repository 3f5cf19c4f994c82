"""Lower layers import no upper ones: simcore is the bottom; backends and workloads build on it;
policies on it too; experiments on everything. (torch stays out of the simulator: only the real
engine's package and the code that builds it import it.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("simcore", "backends", "workloads", "policies", "experiments")
# What each package may import of the others.
ALLOWED = {
    "simcore": set(),
    "backends": {"simcore"},
    "workloads": {"simcore"},
    "policies": {"simcore"},
    "experiments": {"simcore", "backends", "workloads", "policies"},
}


def imported_packages(path: Path) -> set[str]:
    """The project's packages a module imports (anywhere in it, lazily too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found.update(name.split(".")[0] for name in names if name.split(".")[0] in PACKAGES)
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_a_package_imports_only_the_layers_below_it(package):
    wrong = {str(path.relative_to(ROOT)): sorted(imported_packages(path) - ALLOWED[package] - {package})
             for path in sorted((ROOT / package).rglob("*.py"))}
    assert {path: names for path, names in wrong.items() if names} == {}


def test_only_the_real_engine_imports_torch_at_the_top():
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "torch" in path.relative_to(ROOT).parts[:2]:
                continue
            tree = ast.parse(path.read_text())
            top = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
            names = {alias.name.split(".")[0] for node in top for alias in node.names} | \
                {node.module.split(".")[0] for node in top if isinstance(node, ast.ImportFrom) and node.module}
            assert "torch" not in names, path
