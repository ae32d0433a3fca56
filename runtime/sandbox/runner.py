"""Running one command tree in the sandbox: launch, limits, output cap, wall clock, kill.

The launch is ``prlimit <rlimits> -- bwrap <policy> -- <command>``, started as the work
tree's sandbox uid (never as root: as root bwrap keeps reading what root reads and
``RLIMIT_NPROC`` does not apply). bwrap is pid 1 of the sandbox's pid namespace and dies
with its parent, so one SIGKILL to the launched process ends the whole tree, daemons
(``setsid``, ``nohup``) included.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import stat
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import trio

from runtime.sandbox.jail import (
    Identity,
    Limits,
    bwrap_argv,
    generated_etc,
    launcher_environment,
    prlimit_argv,
    through_proxy,
)

# A namespace whose pid 1 is killed is gone within milliseconds; this bounds a stuck one.
_TEARDOWN_SECONDS = 5.0


@dataclass(frozen=True)
class Outcome:
    """What one sandboxed command did.

    ``exit_code`` is None when the sandbox killed it (wall clock or output cap); a command
    killed by a signal inside (CPU limit, memory) reports 128 + the signal, as a shell does.
    ``workspace_bytes`` is the work tree's size after the command.
    """

    exit_code: int | None
    output: bytes
    duration_ms: int
    timed_out: bool
    truncated: bool
    limits: Limits
    workspace_bytes: int


def hand_over(work_tree: Path, identity: Identity) -> int:
    """Give the work tree to the sandbox uid (when the service switches uid) and size it.

    Files the service wrote (as root) become the sandbox's, so its commands can change
    them. Symlinks are never followed: ``lchown`` changes the link itself.

    :return: the bytes of the regular files under the work tree.
    """
    total = 0
    for directory, subdirectories, files in os.walk(work_tree, followlinks=False):
        if identity.switch:
            for name in (".", *subdirectories, *files):
                path = os.path.join(directory, name)
                if os.lstat(path).st_uid != identity.uid:
                    os.lchown(path, identity.uid, identity.gid)
        for name in files:
            status = os.lstat(os.path.join(directory, name))
            if stat.S_ISREG(status.st_mode):
                total += status.st_size
    return total


def workspace_size(work_tree: Path) -> int:
    """The bytes of the regular files under the work tree (symlinks not followed)."""
    return hand_over(work_tree, Identity(0, 0, switch=False))


@contextmanager
def _etc_pipes(identity: Identity) -> Iterator[dict[str, int]]:
    """The generated /etc files as the read ends of pipes bwrap copies them from."""
    fds: dict[str, int] = {}
    try:
        for path, content in generated_etc(identity).items():
            read_end, write_end = os.pipe()
            fds[path] = read_end
            with os.fdopen(write_end, "wb") as writer:
                writer.write(content)  # far below a pipe's buffer: never blocks
        yield fds
    finally:
        for fd in fds.values():
            os.close(fd)


async def _kill_tree(process: trio.Process) -> None:
    # bwrap is pid 1 of the sandbox: killing it takes the whole pid namespace down.
    process.send_signal(signal.SIGKILL)


async def launch(argv: Sequence[str], work_tree: Path, identity: Identity, limits: Limits, *,
                 writable: bool = True, stdin: int = subprocess.DEVNULL,
                 stdout: int = subprocess.PIPE, bridge: Path | None = None,
                 proxied: bool = False,
                 task_status: trio.TaskStatus[trio.Process] = trio.TASK_STATUS_IGNORED) -> None:
    """Run ``argv`` in a sandbox over ``work_tree`` until it ends; for ``nursery.start``.

    Reports the ``trio.Process`` once started (by default its stdout is a pipe of the
    merged output; ``stdin`` and ``stdout`` may be fds instead); cancelling kills the whole
    tree with SIGKILL. ``bridge`` and ``proxied``: see ``jail.bwrap_argv``.
    """
    info_read, info_write = os.pipe()
    try:
        with _etc_pipes(identity) as etc_fds:
            full = [*prlimit_argv(limits),
                    *bwrap_argv(work_tree, limits, etc_fds, writable=writable,
                                allow_userns=False, bridge=bridge, proxied=proxied,
                                info_fd=info_write),
                    *(through_proxy(argv) if proxied else argv)]
            await trio.run_process(
                full, env=launcher_environment(), cwd="/", stdin=stdin, stdout=stdout,
                stderr=subprocess.STDOUT if stdout == subprocess.PIPE else subprocess.DEVNULL,
                check=False, pass_fds=(*etc_fds.values(), info_write),
                deliver_cancel=_kill_tree, task_status=task_status,
                user=identity.uid if identity.switch else None,
                group=identity.gid if identity.switch else None,
                extra_groups=[] if identity.switch else None)
    finally:
        os.close(info_write)
        with trio.CancelScope(shield=True):
            await _torn_down(info_read)
        os.close(info_read)


async def _torn_down(info_fd: int) -> None:
    """Wait until the sandbox's pid namespace is gone.

    Killing bwrap returns at once, while its pid 1 inside (killed by ``--die-with-parent``)
    is still taking the namespace down; once that pid has exited, every process of the
    namespace has. bwrap wrote that pid to the info pipe when it started (nothing there:
    it never started a namespace).
    """
    os.set_blocking(info_fd, False)
    try:
        info = json.loads(os.read(info_fd, 4096) or b"{}")
    except (BlockingIOError, json.JSONDecodeError):
        return
    pid = int(info.get("child-pid", 0))
    with trio.move_on_after(_TEARDOWN_SECONDS):
        # Polled: the kernel gives no event for another process's exit.
        while True:
            if not _running(pid):
                break
            await trio.sleep(0.005)


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and has not exited (/proc is in memory: reading never waits)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def run_sandboxed(argv: Sequence[str], work_tree: Path, identity: Identity,
                        limits: Limits, bridge: Path | None = None) -> Outcome:
    """Run ``argv`` to its end inside the limits and return what it did.

    The output (stdout and stderr merged) is read up to ``limits.output_bytes``; past that
    the command is killed (``truncated``). Past ``limits.wall_seconds`` it is killed
    (``timed_out``). With ``bridge``, the registry proxy's socket in it is forwarded.
    """
    started = time.monotonic()
    kept = bytearray()
    truncated = False
    exit_code: int | None = None
    with trio.move_on_after(limits.wall_seconds) as wall:
        async with trio.open_nursery() as nursery:
            process: trio.Process = await nursery.start(functools.partial(
                launch, argv, work_tree, identity, limits, bridge=bridge,
                proxied=bridge is not None))
            assert process.stdout is not None  # stdout=PIPE in launch
            async for chunk in process.stdout:
                room = limits.output_bytes - len(kept)
                kept += chunk[:room]
                if len(chunk) > room:
                    truncated = True
                    nursery.cancel_scope.cancel()
                    break
        if not truncated:
            status = await process.wait()
            exit_code = status if status >= 0 else 128 - status
    size = await trio.to_thread.run_sync(workspace_size, work_tree)
    return Outcome(exit_code=exit_code, output=bytes(kept),
                   duration_ms=round((time.monotonic() - started) * 1000),
                   timed_out=wall.cancelled_caught, truncated=truncated, limits=limits,
                   workspace_bytes=size)
