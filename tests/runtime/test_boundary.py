"""The plugin boundary holds: plugins reach each other only through runtime contracts.

Every module of ``plugins/<name>/`` may import the runtime, libraries and its own package,
never another plugin's; ``runtime/`` imports no plugin at all (it loads them by name).
Imports are read from the syntax tree, so a name inside a function, a ``TYPE_CHECKING``
block or a relative import counts as much as one at the top of the module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.server import ROOT

PLUGINS = ROOT / "plugins"
RUNTIME = ROOT / "runtime"


def imported_modules(path: Path, package: str) -> list[tuple[int, str]]:
    """Every module ``path`` imports, absolute, with its line (``package``: the module's own
    dotted package, to resolve relative imports)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            # ``from plugins import auth`` imports the module plugins.auth: count each name.
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return sorted(found)


def _package(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])


def _plugin_modules() -> list[Path]:
    return sorted(path for path in PLUGINS.glob("*/**/*.py") if "__pycache__" not in path.parts)


@pytest.mark.parametrize("path", _plugin_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_plugin_imports_no_other_plugin(path: Path) -> None:
    own = path.relative_to(PLUGINS).parts[0]
    crossing = [f"line {line}: {module}" for line, module in imported_modules(path, _package(path))
                if module.startswith("plugins.") and module.split(".")[1] != own]
    assert not crossing, (f"{path.relative_to(ROOT)} imports another plugin; use a contract of "
                          f"runtime/contracts/ instead: {crossing}")


def test_the_runtime_imports_no_plugin() -> None:
    crossing = [f"{path.relative_to(ROOT)} line {line}: {module}"
                for path in sorted(RUNTIME.glob("**/*.py"))
                for line, module in imported_modules(path, _package(path))
                if module == "plugins" or module.startswith("plugins.")]
    assert not crossing, crossing


def test_the_check_sees_what_it_must(tmp_path: Path) -> None:
    """The reader above resolves the import forms a crossing could take."""
    sample = tmp_path / "sample.py"
    sample.write_text("from typing import TYPE_CHECKING\n"
                      "if TYPE_CHECKING:\n    from plugins.projects.runs import start_run\n"
                      "def f():\n    import plugins.auth.routes\n"
                      "from .. import marketplace\nfrom ..keys import meter\n")
    modules = [module for _, module in imported_modules(sample, "plugins.keys")]
    assert modules == ["typing.TYPE_CHECKING", "plugins.projects.runs.start_run",
                       "plugins.auth.routes", "plugins.marketplace", "plugins.keys.meter"]
