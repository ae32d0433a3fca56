"""Stored commits: what storing a commit's files costs, and the artifact zip served from the
database against ``git archive`` of the same commit, in one run.

A workspace of ``--files`` files (``--megabytes`` in all, half text, half random bytes) is
committed; its snapshot (``engine.commit_store``) is read and stored through a service (the
auth, chain and projects plugins, on PostgreSQL when ``FLOWSVC_TEST_POSTGRES_URL`` is set,
else SQLite); then ``GET /projects/<slug>/artifact?ref=<sha>`` and ``git archive
--format=zip`` of the same commit are timed, interleaved, ``--rounds`` times each (medians).
The figures: store seconds against ``git commit`` seconds, and the download against the
archive. No goal: the figures are recorded in ``docs/performance.md``.

Run it with ``python -m bench.bench_artifacts`` (``--help`` lists the knobs).
"""

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import trio

from bench.harness import postgres_schema
from plugins.projects.engine.commit_store import SnapshotReader, store_snapshot
from plugins.projects.engine.workspace import Workspace, git_dir_of
from tests.support.projects import new_project, serve_projects, token_owner


async def build_workspace(root: Path, files: int, megabytes: int) -> Workspace:
    workspace = Workspace(root)
    size = megabytes * 1024 * 1024 // files
    for index in range(files):
        content = os.urandom(size) if index % 2 else \
            "".join(f"line {n} of file {index}\n" for n in range(size // 24)).encode()[:size]
        await workspace.write_file(f"dir{index % 10}/file{index}.bin", content)
    return workspace


async def git_archive(workspace: Workspace, sha: str, output: Path) -> None:
    await trio.run_process(["git", f"--git-dir={git_dir_of(workspace.root)}", "archive",
                            "--format=zip", f"--output={output}", sha])


async def measure(args: argparse.Namespace, database_url: str, folder: Path) -> None:
    workspace = await build_workspace(folder / "workspace", args.files, args.megabytes)
    started = time.perf_counter()
    commit = await workspace.commit("The build")
    commit_seconds = time.perf_counter() - started
    async with serve_projects(folder / "var", database_url) as running, \
            token_owner(running, "bench") as http:
        project = await new_project(http, "bench")
        started = time.perf_counter()
        snapshot = await SnapshotReader(workspace).read(commit.sha)
        await running.service.db.write(store_snapshot, int(project["id"]), "bench-run",
                                       snapshot)
        store_seconds = time.perf_counter() - started
        served: list[float] = []
        archived: list[float] = []
        for _ in range(args.rounds):
            started = time.perf_counter()
            answer = await http.get(f"/projects/{project['slug']}/artifact",
                                    params={"ref": commit.sha}, timeout=120)
            assert answer.status_code == 200, answer.text
            served.append(time.perf_counter() - started)
            started = time.perf_counter()
            await git_archive(workspace, commit.sha, folder / "archive.zip")
            archived.append(time.perf_counter() - started)
        zip_bytes = len(answer.content)
    backend = database_url.split(":", 1)[0]
    print(f"{backend}: {args.files} files, {args.megabytes} MiB")
    print(f"  git commit {commit_seconds:.2f} s; snapshot read + stored {store_seconds:.2f} s "
          f"(ratio {store_seconds / commit_seconds:.2f})")
    print(f"  artifact from the database {statistics.median(served):.2f} s "
          f"({zip_bytes / 1024 / 1024:.1f} MiB zip); git archive "
          f"{statistics.median(archived):.2f} s (ratio "
          f"{statistics.median(served) / statistics.median(archived):.2f})")


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-artifacts-") as folder:
        postgres = os.environ.get("FLOWSVC_TEST_POSTGRES_URL", "")
        if postgres:
            with postgres_schema(postgres) as database_url:
                await measure(args, database_url, Path(folder) / "pg")
        await measure(args, f"sqlite:///{folder}/bench.sqlite", Path(folder) / "sqlite")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--megabytes", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    trio.run(main, parser.parse_args())
