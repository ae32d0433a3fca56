"""A run's events committed through a connection that breaks at ``COMMIT``: whether the
transaction committed (the client cannot tell) or not, the retried batch leaves each event
in the stream once, numbered without a gap.

PostgreSQL is a private one behind ``CommitCutter``, a TCP proxy that breaks the
connection of the publisher's transaction at its ``COMMIT`` (before it reaches the server,
or after the server committed), the way a network fault or a failover does.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from plugins.projects.engine.execute import publisher_for
from plugins.projects.live import event_log
from plugins.projects.settings import ProjectsSettings
from tests.support.commit_cutter import CommitCutter
from tests.support.private_servers import private_postgres
from tests.support.projects import serve_projects

STREAM = "agent-run-commit-test"


@pytest.mark.parametrize("committed", [True, False], ids=["committed", "not-committed"])
async def test_a_batch_retried_after_a_broken_commit_is_written_once(
        tmp_path: Path, nursery: trio.Nursery, committed: bool) -> None:
    with private_postgres() as postgres:
        cutter = CommitCutter(postgres.port)
        await nursery.start(cutter.serve)
        url = postgres.url.replace(f":{postgres.port}/", f":{cutter.port}/")
        async with serve_projects(tmp_path / "var", url) as running:
            service = running.service
            settings = service.plugin_settings("projects", ProjectsSettings)
            publisher = publisher_for(service, settings, STREAM, "run-1", None, None)
            for index in range(3):
                await publisher.emit("message", {"role": "assistant", "text": f"m{index}"})
            cutter.cut_next("project_stream_events", after=committed)
            with trio.fail_after(20):
                await publisher.flush()  # the cut commit is retried after a backoff
            assert cutter.cuts == 1
            for index in range(3, 5):
                await publisher.emit("message", {"role": "assistant", "text": f"m{index}"})
            await publisher.flush()
            events = await service.db.read(event_log.events_between, STREAM, 0, 100)
            assert [(event.seq, event.data) for event in events] == [
                (seq, f'{{"role":"assistant","text":"m{seq - 1}"}}') for seq in range(1, 6)]
            assert await service.db.read(event_log.last_seq, STREAM) == 5
