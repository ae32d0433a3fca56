"""Escape attempts against the sandbox, each contained, each its own test.

Every test runs a real command under the real bubblewrap (``make test`` installs it) and
checks both what the command saw and, where it matters, the host afterwards.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
import trio

from plugins.projects.engine.workspace import Workspace
from runtime.config import SandboxSettings
from runtime.errors import InvalidRequest
from runtime.sandbox import Outcome, Sandbox
from runtime.sandbox.jail import cgroups_state
from tests.support.sandbox import left_running, probed_sandbox

POSTGRES_SOCKET = Path("/var/run/postgresql/.s.PGSQL.5432")


@pytest.fixture
def work_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "ws"
    tree.mkdir()
    return tree


async def run(work_tree: Path, command: str, **limits: object) -> Outcome:
    sandbox = await probed_sandbox(**limits)
    return await sandbox.run(["sh", "-c", command], work_tree)


def text(outcome: Outcome) -> str:
    return outcome.output.decode("utf-8", "replace")


async def test_runs_as_a_non_root_uid_with_no_capabilities(work_tree: Path) -> None:
    outcome = await run(work_tree, "id -u; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status")
    uid, capabilities, no_new_privileges = text(outcome).splitlines()
    expected = SandboxSettings().uid_base if os.geteuid() == 0 else os.getuid()
    assert int(uid) >= expected and int(uid) != 0
    assert capabilities.split() == ["CapEff:", "0000000000000000"]
    assert no_new_privileges.split() == ["NoNewPrivs:", "1"]


async def test_etc_shadow_cannot_be_read(work_tree: Path) -> None:
    outcome = await run(work_tree, "cat /etc/shadow; ls /etc")
    assert outcome.exit_code == 0  # ls ran
    assert "No such file" in text(outcome) and "shadow" not in text(outcome).split()


async def test_the_service_environment_cannot_be_read(
    work_tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOWSVC_TEST_MODEL_KEY", "sk-do-not-leak")
    outcome = await run(work_tree, f"cat /proc/{os.getpid()}/environ; cat /proc/*/environ; "
                                   "env; ls /proc")
    assert "sk-do-not-leak" not in text(outcome)
    pids = [name for name in text(outcome).split() if name.isdigit()]
    assert str(os.getpid()) not in pids and len(pids) < 10  # its own pid namespace


async def test_another_project_workspace_is_out_of_sight(tmp_path: Path,
                                                         work_tree: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "secret.txt").write_text("other project's secret")
    outcome = await run(work_tree, f"cat {other}/secret.txt; ls /; ls {tmp_path}")
    assert "other project's secret" not in text(outcome)
    assert sorted(text(outcome).split()).count("workspace") == 1


async def test_nothing_outside_the_work_tree_can_be_written(tmp_path: Path,
                                                            work_tree: Path) -> None:
    outcome = await run(work_tree, f"touch /usr/x; touch /etc/x; touch /x; touch {tmp_path}/x; "
                                   "touch inside; echo done")
    assert text(outcome).endswith("done\n")
    assert not await trio.Path(tmp_path / "x").exists()
    assert not await trio.Path("/usr/x").exists()
    assert (work_tree / "inside").exists()


async def test_the_git_directory_is_out_of_reach(tmp_path: Path) -> None:
    workspace = Workspace(tmp_path / "project")
    await workspace.write_file("a.txt", "a")
    await workspace.commit("Add a")
    config_before = (workspace.git_dir / "config").read_text()
    outcome = await run(workspace.root, "echo '[core] fsmonitor = touch /tmp/x' >> "
                                        "../project.git/config; mkdir -p ../project.git/hooks; "
                                        "ls ..; echo done")
    assert text(outcome).endswith("done\n")
    assert (workspace.git_dir / "config").read_text() == config_before
    hooks = await trio.Path(workspace.git_dir / "hooks").iterdir()
    assert hooks and all(path.suffix == ".sample" for path in hooks)  # git's own, inert


async def test_host_unix_sockets_are_out_of_reach(tmp_path: Path, work_tree: Path) -> None:
    """PostgreSQL's socket (trust authentication as superuser on a Debian host) and any
    other Unix socket of the host: nothing outside the work tree is mounted."""
    own = trio.socket.socket(trio.socket.AF_UNIX)
    await own.bind(str(tmp_path / "service.sock"))
    own.listen()
    probe = ("import socket, sys\nfor path in sys.argv[1:]:\n"
             "    s = socket.socket(socket.AF_UNIX)\n    try:\n        s.connect(path)\n"
             "        print('connected', path)\n"
             "    except OSError as exc:\n        print('refused', path, exc.strerror)\n")
    (work_tree / "connect.py").write_text(probe)
    outcome = await run(work_tree, f"python3 connect.py {POSTGRES_SOCKET} {tmp_path}/service.sock")
    own.close()
    assert "connected" not in text(outcome)
    assert text(outcome).count("No such file or directory") == 2


async def test_a_loopback_service_of_the_host_is_out_of_reach(work_tree: Path) -> None:
    reached: list[trio.SocketStream] = []

    async def note(stream: trio.SocketStream) -> None:
        reached.append(stream)
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        [listener] = await nursery.start(functools.partial(trio.serve_tcp, note, 0,
                                                           host="127.0.0.1"))
        port = listener.socket.getsockname()[1]
        probe = (f"import socket; socket.create_connection(('127.0.0.1', {port}), 2); "
                 "print('connected')")
        outcome = await run(work_tree, f"python3 -c \"{probe}\" 2>&1 | tail -1")
        nursery.cancel_scope.cancel()
    assert "connected" not in text(outcome) and "refused" in text(outcome).lower()
    assert reached == []


async def test_loopback_inside_the_sandbox_works(work_tree: Path) -> None:
    (work_tree / "page.txt").write_text("served inside\n")
    server = ("import http.server, threading, urllib.request, functools; "
              "s = http.server.HTTPServer(('127.0.0.1', 0), http.server.SimpleHTTPRequestHandler);"
              " threading.Thread(target=s.serve_forever, daemon=True).start(); "
              "print(urllib.request.urlopen(f'http://127.0.0.1:{s.server_port}/page.txt')"
              ".read().decode())")
    outcome = await run(work_tree, f"python3 -c \"{server}\" 2>/dev/null")
    assert text(outcome) == "served inside\n\n"


async def test_no_outside_name_or_address_is_reached(work_tree: Path) -> None:
    outcome = await run(work_tree, "getent hosts deb.debian.org || echo no-name; "
                                   "python3 -c \"import socket; socket.create_connection("
                                   "('1.1.1.1', 53), 2)\" 2>&1 | tail -1; cat /proc/net/dev")
    assert "no-name" in text(outcome)
    assert "Network is unreachable" in text(outcome)
    # /proc/net/dev: two header lines, then one line per interface.
    interfaces = [line.split(":")[0].strip() for line in text(outcome).splitlines()[4:]]
    assert interfaces == ["lo"]


async def test_a_fork_bomb_hits_the_process_limit(work_tree: Path) -> None:
    forks = ("import subprocess\nstarted = 0\nfor _ in range(200):\n    try:\n"
             "        subprocess.Popen(['sleep', '2991'])\n        started += 1\n"
             "    except OSError:\n        pass\nprint(started)\n")
    (work_tree / "forks.py").write_text(forks)
    outcome = await run(work_tree, "python3 forks.py", processes=40)
    assert 0 < int(text(outcome).split()[-1]) < 40
    assert left_running(work_tree, b"2991") == []


async def test_a_shell_fork_bomb_ends_with_the_call(work_tree: Path) -> None:
    outcome = await run(work_tree, "b() { b | b & }; b; sleep 2989", processes=64,
                        wall_seconds=5)
    assert outcome.timed_out and outcome.duration_ms < 20_000
    assert left_running(work_tree, b"2989") == []


async def test_a_memory_bomb_is_refused(work_tree: Path) -> None:
    outcome = await run(work_tree, "python3 -c 'bytearray(3 * 1024**3)'",
                        memory_bytes=512 * 1024**2)
    assert outcome.exit_code != 0 and "MemoryError" in text(outcome)


async def test_a_cpu_loop_is_stopped_by_the_cpu_limit(work_tree: Path) -> None:
    outcome = await run(work_tree, "python3 -c 'while True: pass'", cpu_seconds=1)
    assert outcome.exit_code is not None and outcome.exit_code > 128  # killed by a signal
    assert not outcome.timed_out and outcome.duration_ms < 60_000


async def test_a_never_ending_command_is_killed_at_the_wall_clock(work_tree: Path) -> None:
    outcome = await run(work_tree, "echo started; sleep 2995", wall_seconds=1)
    assert outcome.timed_out and outcome.exit_code is None
    assert text(outcome) == "started\n" and outcome.duration_ms < 10_000
    assert left_running(work_tree, b"2995") == []


async def test_an_output_flood_is_cut_and_killed(work_tree: Path) -> None:
    outcome = await run(work_tree, "yes flood", output_bytes=65536)
    assert outcome.truncated and len(outcome.output) == 65536
    assert outcome.exit_code is None and not outcome.timed_out


async def test_a_file_bigger_than_the_cap_stops_at_the_cap(work_tree: Path) -> None:
    outcome = await run(work_tree, "head -c 5000000 /dev/zero > big; head -c 3000000 /dev/zero"
                                   " > /tmp/big || echo tmp-full",
                        file_bytes=1024**2, tmp_bytes=2 * 1024**2)
    assert (work_tree / "big").stat().st_size == 1024**2
    assert "tmp-full" in text(outcome)


async def test_a_terminal_cannot_be_injected_into(work_tree: Path) -> None:
    probe = ("import fcntl, termios\nfor target in ('/dev/tty', 0, 1, 2):\n    try:\n"
             "        fd = open(target, 'wb', buffering=0).fileno() if isinstance(target, str)"
             " else target\n        fcntl.ioctl(fd, termios.TIOCSTI, b'x')\n"
             "        print('injected', target)\n    except OSError as exc:\n"
             "        print('refused', target, exc.errno)\n")
    (work_tree / "tiocsti.py").write_text(probe)
    outcome = await run(work_tree, "python3 tiocsti.py")
    assert "injected" not in text(outcome) and text(outcome).count("refused") == 4


async def test_a_setuid_binary_gains_nothing(work_tree: Path) -> None:
    assert (await trio.Path("/usr/bin/su").stat()).st_mode & 0o4000  # setuid on the host
    outcome = await run(work_tree, "su -c 'id -u' root </dev/null; mount -t tmpfs none /tmp "
                                   "2>&1; id -u")
    assert text(outcome).split()[-1] != "0" and "\n0\n" not in f"\n{text(outcome)}"


async def test_daemons_are_gone_when_the_call_ends(work_tree: Path) -> None:
    outcome = await run(work_tree, "setsid sleep 2994 & nohup sleep 2993 >/dev/null 2>&1 & "
                                   "(setsid sh -c 'sleep 2992 &'); echo left")
    assert text(outcome) == "left\n" and outcome.exit_code == 0
    assert left_running(work_tree, b"299") == []


async def test_without_bwrap_nothing_runs(work_tree: Path, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    sandbox = Sandbox(SandboxSettings())
    await sandbox.probe()
    assert sandbox.reasons["commands"] == ("bwrap not found: install the Debian package "
                                           "bubblewrap")
    assert sandbox.health() == {"ok": True, "commands": sandbox.reasons["commands"],
                                "browser": sandbox.reasons["commands"],
                                "cgroups": cgroups_state()}
    with pytest.raises(Exception, match="the sandbox is unavailable: bwrap not found"):
        await sandbox.run(["touch", "ran"], work_tree)
    assert not (work_tree / "ran").exists()


async def test_the_work_tree_size_cap_is_enforced(work_tree: Path) -> None:
    sandbox = await probed_sandbox(workspace_bytes=1024**2)
    (work_tree / "big").write_bytes(b"x" * (2 * 1024**2))
    with pytest.raises(Exception, match="over its cap"):
        await sandbox.run(["touch", "ran"], work_tree)
    assert not (work_tree / "ran").exists()


async def test_a_page_that_cannot_be_loaded_is_refused(work_tree: Path) -> None:
    sandbox = await probed_sandbox()
    with pytest.raises(InvalidRequest, match="could not be loaded: net::ERR_CONNECTION_REFUSED"):
        await sandbox.screenshot(work_tree, "http://127.0.0.1:8793/")
    assert left_running(work_tree, b"--remote-debugging-pipe") == []
