"""Vendored third-party files are the ones recorded: every file of a vendor folder is listed
in its ``SHA256SUMS`` with the checksum it has, carries its version in its name and has its
licence beside it."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENDOR_FOLDERS = [ROOT / "tests" / "support" / "vendor",
                  *sorted((ROOT / "plugins").glob("*/static/vendor"))]
VERSIONED = re.compile(r"^(?P<name>[a-z0-9.-]+?)-(?P<version>\d+\.\d+\.\d+)\.(?P<kind>min\.js|"
                       r"min\.css|js|css|LICENSE)$")


def test_every_vendored_file_matches_its_recorded_checksum() -> None:
    assert VENDOR_FOLDERS[0].is_dir()
    for folder in VENDOR_FOLDERS:
        recorded = {}
        for line in (folder / "SHA256SUMS").read_text().splitlines():
            digest, name = line.split(maxsplit=1)
            recorded[name] = digest
        files = {path.name for path in folder.iterdir()} - {"SHA256SUMS", "README.md"}
        assert files == set(recorded), folder
        for name, digest in recorded.items():
            assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, name


def test_every_vendored_file_has_its_version_and_licence() -> None:
    for folder in VENDOR_FOLDERS:
        for path in folder.iterdir():
            if path.name in ("SHA256SUMS", "README.md"):
                continue
            match = VERSIONED.match(path.name)
            assert match is not None, path.name
            licence = folder / f"{match['name']}-{match['version']}.LICENSE"
            assert licence.is_file(), path.name
            assert path.name in (folder / "README.md").read_text()
