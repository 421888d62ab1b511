"""The layout keeps showing the architecture: small modules, no import cycle, and every package
saying what it owns (the layering itself is import-linter's: `make imports`)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"specon": ROOT / "specon", "specon_agent": ROOT / "agent" / "specon_agent"}
PACKAGES["specon_manager"] = ROOT / "manager" / "specon_manager"
MAX_LINES = 600


def _modules() -> list[Path]:
    return sorted(p for base in PACKAGES.values() for p in base.rglob("*.py"))


def test_no_module_is_over_600_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"split these along their concerns: {long}"


def test_every_package_says_what_it_owns() -> None:
    """Each package's ``__init__`` has a docstring that names each of its modules and
    subpackages (``foo`` for foo.py and foo/), so the tree can be read from the top. A
    plug-in module (a priority rule: it declares ``RULE``) is listed by its registry
    (``specon config defaults``): adding one touches that module alone."""
    missing: dict[str, list[str]] = {}
    for base in PACKAGES.values():
        for init in [base / "__init__.py", *base.rglob("*/__init__.py")]:
            if "data" in init.relative_to(ROOT).parts:
                continue
            doc = ast.get_docstring(ast.parse(init.read_text())) or ""
            parts = [
                p.stem
                for p in init.parent.glob("*.py")
                if p.stem not in ("__init__", "__main__") and "\nRULE = " not in p.read_text()
            ]
            parts += [p.parent.name for p in init.parent.glob("*/__init__.py")]
            if not doc or (absent := [m for m in parts if f"``{m}``" not in doc and f"{m}/" not in doc]):
                missing[str(init.relative_to(ROOT))] = parts if not doc else absent
    assert not missing, f"name these in the package docstring: {missing}"


def test_no_import_cycle_between_modules() -> None:
    """Lazy imports inside functions count; imports for type checking only do not."""
    sys.path[:0] = [str(ROOT), str(ROOT / "agent"), str(ROOT / "manager")]
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=True, cache_dir=None)
    cycles = [
        (m, chain)
        for m in sorted(graph.modules)
        for imported in graph.find_modules_directly_imported_by(m)
        if (chain := graph.find_shortest_chain(importer=imported, imported=m)) is not None
    ]
    assert not cycles, f"import cycles: {cycles[:5]}"
