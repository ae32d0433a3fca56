"""Serving: we own the root nursery; actors and hypercorn run inside it.

``run_server`` opens the service, starts the supervisor and every actor, then hypercorn's
Trio worker (``runtime.connections``: a connection cap, the descriptor limit raised) with a
shutdown trigger. SIGINT or SIGTERM first drains (``runtime.drain``): ``/readyz`` answers 503
``draining``, connections close after their current request, plugins stop starting work and
end their streams, and the work they hold (runs in progress) gets up to
``service.drain_seconds`` to finish. Then it stops accepting, lets in-flight requests finish
within ``service.shutdown_grace_seconds``, stops the actors in reverse order (which end the
runs still going) and returns 0. A second signal during the drain cuts it short. When the
supervisor gives up (an actor keeps crashing) the same clean shutdown happens without a
drain and the reason is logged; the exit code is then 1.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from functools import partial
from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig

from runtime.bootstrap import open_service
from runtime.config import ConfigError, Settings
from runtime.connections import (
    ConnectionGate,
    connection_cap,
    raise_descriptor_limit,
    serve_http,
)
from runtime.drain import Drain
from runtime.early_response import guard_early_responses
from runtime.http import create_app
from runtime.service import Service

log = logging.getLogger("flowsvc.server")


def hypercorn_config(settings: Settings, bind: str) -> HypercornConfig:
    config = HypercornConfig()
    config.bind = [bind]
    config.accesslog = None  # our own structured access log replaces it
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = settings.service.shutdown_grace_seconds
    config.max_app_queue_size = 64
    config.backlog = 1024  # connections the kernel queues before accepting (hypercorn: 100)
    # hypercorn's own idle timer, until a connection's first request; runtime.connections
    # keeps the same timeout after that.
    config.keep_alive_timeout = settings.service.keep_alive_timeout_seconds
    return config


def _tune_gc() -> None:
    """Freeze the start-up heap and collect young objects less often.

    Under SSE fan-out, full collections of the service's large long-lived heap paused the
    process 150-350 ms about once a second (docs/performance.md); objects that exist once
    the app is built live as long as the process, so the collector need not scan them.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


async def _serve_http(app: Any, config: HypercornConfig, gate: ConnectionGate, stop: trio.Event,
                      served: trio.Event, *,
                      task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED
                      ) -> None:
    try:
        await serve_http(app, config, gate, shutdown_trigger=stop.wait, task_status=task_status)
    finally:
        served.set()


async def _drain_on_signals(drain: Drain, stop: trio.Event) -> None:
    """The first SIGINT or SIGTERM begins the drain; a second one stops at once."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            name = signal.Signals(signum).name
            if drain.draining:
                log.warning("received %s while draining: stopping now", name)
                stop.set()
                return
            log.info("received %s: draining", name)
            drain.begin()


async def _stop_after_drain(drain: Drain, gate: ConnectionGate, seconds: float,
                            stop: trio.Event) -> None:
    """Once the drain began: close connections after their current request, wait up to
    ``seconds`` for the work plugins hold, then stop."""
    await drain.began.wait()
    gate.close_idle()
    with trio.move_on_after(seconds) as waited:
        await drain.wait_released()
    if waited.cancelled_caught:
        log.warning("drain: work still in progress after %g s; stopping it", seconds)
    else:
        log.info("drain: no work in progress; stopping")
    stop.set()


async def _stop_when(event: trio.Event, stop: trio.Event) -> None:
    await event.wait()
    stop.set()


@dataclass(frozen=True)
class Running:
    """What ``run_server`` hands to ``task_status.started``: where it listens, and the service."""

    binds: list[str]
    service: Service

    @property
    def base_url(self) -> str:
        return self.binds[0]


async def run_server(settings: Settings, *, bind: str | None = None, handle_signals: bool = True,
                     stop: trio.Event | None = None, environ: dict[str, str] | None = None,
                     task_status: trio.TaskStatus[Running] = trio.TASK_STATUS_IGNORED) -> int:
    """Serve until a signal, ``stop``, or the supervisor giving up.

    :param bind: ``HOST:PORT`` or ``fd://N``; default ``service.bind``.
    :param stop: set it to shut down (tests use this instead of signals).
    :param environ: where plugin settings overrides are read (default ``os.environ``).
    :return: the process exit code (0 clean, 1 when the supervisor gave up).
    """
    stop = trio.Event() if stop is None else stop
    served = trio.Event()
    async with open_service(settings, environ=environ) as service, \
            trio.open_nursery() as nursery:
        supervisor = await service.start_actors(nursery)
        nursery.start_soon(_stop_when, supervisor.gave_up, stop)
        config = hypercorn_config(settings, bind or settings.service.bind)
        app = guard_early_responses(create_app(service),
                                    max_drain_bytes=settings.service.max_body_bytes)
        descriptors = raise_descriptor_limit()
        gate = ConnectionGate(connection_cap(settings.service.max_connections, descriptors),
                              settings.service.keep_alive_timeout_seconds, service.metrics)
        if handle_signals:
            nursery.start_soon(_drain_on_signals, service.drain, stop)
        nursery.start_soon(_stop_after_drain, service.drain, gate,
                           settings.service.drain_seconds, stop)
        _tune_gc()
        binds = await nursery.start(_serve_http, app, config, gate, stop, served)
        log.info("flowsvc serving on %s (at most %d connections; %d descriptors)",
                 ", ".join(binds), gate.limit, descriptors)
        task_status.started(Running(binds, service))
        await served.wait()
        await supervisor.stop_all()
        nursery.cancel_scope.cancel()
    if supervisor.gave_up.is_set():
        log.error("flowsvc stopped: %s", supervisor.reason)
        return 1
    log.info("flowsvc stopped cleanly")
    return 0


def check_workers(settings: Settings, workers: int) -> None:
    """Refuse several workers without Redis: in-process meters and rings cannot be shared.

    :raises ConfigError: more than one worker without ``FLOWSVC_REDIS_URL``.
    """
    if workers > 1 and not settings.redis.url:
        raise ConfigError("--workers > 1 needs Redis (set FLOWSVC_REDIS_URL): in-process meters "
                          "and stream rings cannot be shared between processes")


def serve_workers(settings: Settings, config_path: str | None, bind: str, workers: int) -> int:
    """Run ``workers`` service processes sharing one listening socket.

    :raises ConfigError: see ``check_workers``.
    """
    check_workers(settings, workers)
    host, _, port = bind.rpartition(":")
    listener = socket.create_server((host.strip("[]"), int(port)), reuse_port=False, backlog=1024)
    listener.set_inheritable(True)
    config = ["--config", config_path] if config_path else []
    argv = [sys.executable, "-m", "runtime.cli", *config, "serve", "--workers", "1",
            "--bind", f"fd://{listener.fileno()}"]
    # The workers listen on an inherited descriptor: tell them the public URL of the bind.
    env = {**os.environ, "FLOWSVC_DATABASE_MIGRATE_ON_START": "false",
           "FLOWSVC_SERVICE_PUBLIC_URL": settings.service.public_url}
    children = [subprocess.Popen(argv, pass_fds=[listener.fileno()], env=env)
                for _ in range(workers)]
    return trio.run(partial(_wait_children, children))


async def _wait_children(children: list[subprocess.Popen[bytes]]) -> int:
    async def forward_signals() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                for child in children:
                    child.send_signal(signum)

    codes: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(forward_signals)
        for child in children:
            codes.append(await trio.to_thread.run_sync(child.wait))
        nursery.cancel_scope.cancel()
    return max(codes, default=0)
