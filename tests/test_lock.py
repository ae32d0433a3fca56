"""requirements.lock pins every Python dependency the pyproject files name, with hashes.

``make`` installs from the lock alone (``--require-hashes``) and then our own packages with
``--no-deps``, so a dependency added to a pyproject file but not locked would be missing on a
fresh machine; this test names it first, and says to run ``make lock``.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.support.server import ROOT

PYPROJECTS = [ROOT / "pyproject.toml", ROOT / "client" / "pyproject.toml"]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+) \\$")


def locked() -> dict[str, tuple[Version, int]]:
    """Each locked package: its version and how many hashes it carries."""
    pins: dict[str, tuple[Version, int]] = {}
    current = ""
    for line in (ROOT / "requirements.lock").read_text(encoding="utf-8").splitlines():
        if pin := PIN.match(line):
            current = canonicalize_name(pin.group(1))
            pins[current] = (Version(pin.group(2)), 0)
        elif line.strip().startswith("--hash=sha256:") and current:
            version, hashes = pins[current]
            pins[current] = (version, hashes + 1)
    return pins


def declared(path: Path) -> list[Requirement]:
    project = tomllib.loads(path.read_text(encoding="utf-8"))["project"]
    names = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        names.extend(extra)
    return [Requirement(name) for name in names]


def test_every_declared_dependency_is_locked_within_its_range_with_hashes() -> None:
    pins = locked()
    assert pins, "requirements.lock lists no package"
    problems = []
    for path in PYPROJECTS:
        for requirement in declared(path):
            name = canonicalize_name(requirement.name)
            if name not in pins:
                problems.append(f"{requirement} ({path.name}) is not in requirements.lock")
                continue
            version, hashes = pins[name]
            if not requirement.specifier.contains(version, prereleases=True):
                problems.append(f"{name}=={version} is outside {requirement}")
            if hashes == 0:
                problems.append(f"{name} has no hash")
    assert not problems, "run `make lock`:\n" + "\n".join(problems)


def test_every_locked_package_has_a_hash() -> None:
    assert all(hashes > 0 for _, hashes in locked().values())
