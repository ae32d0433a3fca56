"""The real sandbox for tests, a git helper for work trees, and a PNG reader.

A test that needs the sandbox fails, never skips, when bwrap or chromium is missing or the
host refuses user namespaces: ``make test`` installs both Debian packages.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import trio

from plugins.projects.engine.workspace import git_dir_of
from runtime.config import SandboxSettings
from runtime.sandbox import Sandbox
from runtime.sandbox.jail import identity_for


async def probed_sandbox(**settings: object) -> Sandbox:
    """A probed sandbox with ``[sandbox]`` settings overridden by ``settings``."""
    sandbox = Sandbox(SandboxSettings.model_validate(settings))
    await sandbox.probe()
    assert sandbox.offers("commands") and sandbox.offers("browser"), (
        f"the sandbox cannot run here: {sandbox.reasons} (make test installs bubblewrap "
        "and chromium)")
    return sandbox


async def git(work_tree: Path, *arguments: str) -> str:
    """Run git on a workspace, whose git directory lies beside its work tree."""
    result = await trio.run_process(["git", f"--git-dir={git_dir_of(work_tree)}",
                                     f"--work-tree={work_tree}", *arguments],
                                    cwd=work_tree, capture_stdout=True)
    return result.stdout.decode()


def processes_running(word: bytes) -> list[int]:
    """The pids of the host's live processes with ``word`` in their command line."""
    return [pid for pid, cmdline, _ in _processes() if word in cmdline]


def left_running(work_tree: Path, word: bytes) -> list[int]:
    """The host's live processes a sandbox over ``work_tree`` left behind: as root, any of
    its sandbox uid (no other test shares it); otherwise any with ``word`` in its command
    line."""
    if os.geteuid() != 0:
        return processes_running(word)
    uid = identity_for(work_tree, SandboxSettings()).uid
    return [pid for pid, _, owner in _processes() if owner == uid]


def _processes() -> list[tuple[int, bytes, int]]:
    """(pid, command line, real uid) of every live (not zombie) process of the host."""
    found = []
    for folder in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (folder / "cmdline").read_bytes()
            status = (folder / "status").read_text()
        except OSError:  # it ended while we looked
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields["State"].split()[0] != "Z":
            found.append((int(folder.name), cmdline, int(fields["Uid"].split()[0])))
    return found


@dataclass(frozen=True)
class Png:
    """A decoded 8-bit RGB or RGBA PNG."""

    width: int
    height: int
    channels: int
    rows: list[bytes]

    def pixel(self, x: int, y: int) -> tuple[int, ...]:
        start = x * self.channels
        return tuple(self.rows[y][start:start + 3])


def read_png(data: bytes) -> Png:
    """Decode a PNG with zlib and struct (8-bit, RGB or RGBA, not interlaced)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    position, chunks, header = 8, bytearray(), b""
    while position < len(data):
        (length,) = struct.unpack(">I", data[position:position + 4])
        kind = data[position + 4:position + 8]
        body = data[position + 8:position + 8 + length]
        position += 12 + length
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            chunks += body
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(bytes(chunks))
    stride = width * channels
    rows: list[bytes] = []
    previous = bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            corner = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                guess = left + up - corner
                near = min((abs(guess - left), 0, left), (abs(guess - up), 1, up),
                           (abs(guess - corner), 2, corner))
                line[i] = (line[i] + near[2]) & 0xFF
        rows.append(bytes(line))
        previous = line
    return Png(width, height, channels, rows)
