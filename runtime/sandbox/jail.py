"""The bubblewrap command line of one sandboxed process, and who it runs as.

Everything here is a pure function of the limits and the paths, so the policy can be read
in one place (docs/agent-runtime.md explains each choice and what was measured):

- only ``/usr`` and a few named ``/etc`` files are mounted, read-only; never ``/`` (a
  read-only ``/`` still lets a process connect to the host's Unix sockets, PostgreSQL's
  included);
- the work tree is the one writable mount (read-only for the browser), ``/tmp`` a
  size-capped tmpfs;
- every namespace is new (no network but the sandbox's own loopback), capabilities are
  dropped, the process gets a new session (no TIOCSTI into a terminal) and dies with its
  parent;
- the environment is given, never inherited.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from runtime.config import SandboxSettings
from runtime.sandbox.proxy import PROXY_PORT, PROXY_SOCKET

WORK_TREE = "/workspace"
BRIDGE = "/run/bridge"
# Paths inside the sandbox: its own size-capped tmpfs mounts, not the host's.
SANDBOX_TMP = "/tmp"  # noqa: S108
SANDBOX_SHM = "/dev/shm"  # noqa: S108
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
# Read-only entries outside /usr a build or a browser needs; none of them holds a secret.
_READ_ONLY = tuple(f"/etc/{name}" for name in (
    "alternatives", "ld.so.cache", "localtime", "fonts", "mime.types", "ssl/certs")) + (
    "/var/cache/fontconfig",)


@dataclass(frozen=True)
class Identity:
    """The outside uid and gid a sandbox runs as; ``switch`` when the service must drop to
    them (it runs as root), False when the service's own non-root ids are used."""

    uid: int
    gid: int
    switch: bool


def identity_for(work_tree: Path, settings: SandboxSettings) -> Identity:
    """The uid a work tree's commands run as.

    As root: a dedicated uid from ``[uid_base, uid_base + uid_count)`` chosen by the work
    tree's path, so each project gets its own process budget and file ownership (two work
    trees sharing a uid by chance still see only their own files: nothing else is mounted).
    Otherwise the service's own ids: an unprivileged process cannot switch to another uid.
    """
    if os.geteuid() != 0:
        return Identity(os.getuid(), os.getgid(), switch=False)
    slot = zlib.crc32(str(work_tree.resolve()).encode()) % settings.uid_count
    uid = settings.uid_base + slot
    return Identity(uid, uid, switch=True)


def closed_parent(work_tree: Path) -> Path | None:
    """The first folder above ``work_tree`` another uid cannot pass through, if any (bwrap,
    running as the sandbox uid, must reach the work tree to mount it)."""
    for parent in reversed(work_tree.resolve().parents):
        if not os.stat(parent).st_mode & 0o001:
            return parent
    return None


@dataclass(frozen=True)
class Limits:
    """The limits of one sandboxed process tree; ``memory_bytes`` None: no address-space
    cap (a browser reserves far more address space than it uses); ``network`` says what it
    may reach (``none``, or the registries of the proxy), ``cgroups`` whether cgroups
    limit it."""

    cpu_seconds: int
    memory_bytes: int | None
    file_bytes: int
    processes: int
    open_files: int
    wall_seconds: float
    output_bytes: int
    workspace_bytes: int
    tmp_bytes: int
    network: str
    cgroups: str

    @classmethod
    def from_settings(cls, settings: SandboxSettings) -> Limits:
        return cls(cpu_seconds=settings.cpu_seconds, memory_bytes=settings.memory_bytes,
                   file_bytes=settings.file_bytes, processes=settings.processes,
                   open_files=settings.open_files, wall_seconds=settings.wall_seconds,
                   output_bytes=settings.output_bytes, workspace_bytes=settings.workspace_bytes,
                   tmp_bytes=settings.tmp_bytes,
                   network=("https to " + ", ".join(settings.registries) + " via the proxy"
                            if settings.registries else "none"),
                   cgroups=cgroups_state())

    def described(self) -> dict[str, int | float | str | None]:
        """The limits as a ``tool_result`` shows them (camelCase)."""
        return {"cpuSeconds": self.cpu_seconds, "memoryBytes": self.memory_bytes,
                "fileBytes": self.file_bytes, "processes": self.processes,
                "openFiles": self.open_files, "wallSeconds": self.wall_seconds,
                "outputBytes": self.output_bytes, "workspaceBytes": self.workspace_bytes,
                "tmpBytes": self.tmp_bytes, "network": self.network, "cgroups": self.cgroups}


def cgroups_state() -> str:
    """What cgroups do for the sandbox here: nothing yet; the reason names the host."""
    fallback = "(rlimits and the wall clock apply)"
    if not Path("/sys/fs/cgroup/cgroup.controllers").is_file():
        return f"unavailable: this host has no cgroup v2 hierarchy {fallback}"
    return f"unavailable: cgroup v2 is present but not used yet {fallback}"


def generated_etc(identity: Identity) -> dict[str, bytes]:
    """The small /etc files made for the sandbox: who the uid is, and that localhost is
    the sandbox's own loopback."""
    return {
        "/etc/passwd": (f"root:x:0:0:root:/root:/bin/sh\n"
                        f"sandbox:x:{identity.uid}:{identity.gid}:sandbox:/tmp:/bin/sh\n"
                        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n").encode(),
        "/etc/group": f"root:x:0:\nsandbox:x:{identity.gid}:\nnogroup:x:65534:\n".encode(),
        "/etc/hosts": b"127.0.0.1 localhost\n::1 localhost\n",
        "/etc/nsswitch.conf": b"passwd: files\ngroup: files\nhosts: files\n",
    }


def prlimit_argv(limits: Limits) -> list[str]:
    """``prlimit`` setting the rlimits before bwrap starts (inherited by the whole tree)."""
    argv = ["prlimit", f"--cpu={limits.cpu_seconds}", f"--fsize={limits.file_bytes}",
            f"--nproc={limits.processes}", f"--nofile={limits.open_files}", "--core=0"]
    if limits.memory_bytes is not None:
        argv.append(f"--as={limits.memory_bytes}")
    return [*argv, "--"]


def bwrap_argv(work_tree: Path, limits: Limits, etc_fds: dict[str, int], *,
               writable: bool = True, allow_userns: bool = False,
               bridge: Path | None = None, proxied: bool = False,
               info_fd: int | None = None) -> list[str]:
    """The bwrap options (without the command) for one sandbox.

    :param etc_fds: generated /etc files by path, each an inherited readable fd.
    :param writable: False mounts the work tree read-only (the browser only reads it).
    :param allow_userns: keep nested user namespaces allowed (off for commands).
    :param bridge: a folder mounted at ``BRIDGE``, where a dev server's Unix socket is
        shared between a command's sandbox and a browser's, or the registry proxy's socket.
    :param proxied: point ``HTTP(S)_PROXY`` at the registry proxy's forwarded port.
    :param info_fd: an inherited fd where bwrap writes the host pid of the sandbox's pid 1.
    """
    argv = ["bwrap", "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session",
            "--cap-drop", "ALL"]
    if not allow_userns:
        argv.append("--disable-userns")
    if info_fd is not None:
        argv += ["--info-fd", str(info_fd)]
    argv += ["--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin",
             "--symlink", "usr/sbin", "/sbin", "--symlink", "usr/lib", "/lib"]
    if Path("/usr/lib64").is_dir():
        argv += ["--symlink", "usr/lib64", "/lib64"]
    for entry in _READ_ONLY:
        argv += ["--ro-bind-try", entry, entry]
    for path, fd in sorted(etc_fds.items()):
        argv += ["--ro-bind-data", str(fd), path]
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", str(limits.tmp_bytes),
             "--tmpfs", SANDBOX_TMP, "--size", str(limits.tmp_bytes), "--tmpfs", SANDBOX_SHM,
             "--bind" if writable else "--ro-bind", str(work_tree), WORK_TREE,
             "--chdir", WORK_TREE, "--clearenv"]
    if bridge is not None:
        argv += ["--bind", str(bridge), BRIDGE]
    for name, value in sandbox_environment(proxied).items():
        argv += ["--setenv", name, value]
    return [*argv, "--"]


def sandbox_environment(proxied: bool = False) -> dict[str, str]:
    """The whole environment of a sandboxed command: nothing of the service's."""
    environment = {"PATH": SANDBOX_PATH, "HOME": SANDBOX_TMP, "USER": "sandbox",
                   "LANG": "C.UTF-8", "TMPDIR": SANDBOX_TMP}
    if proxied:
        proxy = f"http://127.0.0.1:{PROXY_PORT}"
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
            environment[name] = proxy
    return environment


def through_proxy(argv: Sequence[str]) -> list[str]:
    """``argv`` behind a forwarder of the proxy port to the bridge's proxy socket, started
    (and answering) before the command runs."""
    forward = (f"socat TCP-LISTEN:{PROXY_PORT},bind=127.0.0.1,fork,reuseaddr "
               f"UNIX-CONNECT:{BRIDGE}/{PROXY_SOCKET} & "
               f"for _ in $(seq 100); do socat -u /dev/null TCP:127.0.0.1:{PROXY_PORT} "
               '2>/dev/null && break; sleep 0.05; done; exec "$@"')
    return ["sh", "-c", forward, "sh", *argv]


def launcher_environment() -> dict[str, str]:
    """The environment bwrap itself starts with. bwrap's own process stays pid 1 inside the
    sandbox, and ``/proc/1/environ`` is readable there: it must hold no secret either."""
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
