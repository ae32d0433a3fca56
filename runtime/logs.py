"""Logging of the ``flowsvc`` command: one line per record on stderr, written in batches.

A service logs one access line per request, so writing them must cost little: records are
formatted as they come but written together, one ``write`` per batch instead of one
``write`` and ``flush`` per line; ``LogRecord`` skips the caller's frame and the thread and
process fields no line shows (the logging documentation's "Optimization" advice); and the
time stamp's date and time are formatted once a second. A batch is written when it holds
``BATCH_RECORDS`` lines, when a warning or worse arrives (problems show at once), when
``flush_logs`` runs (the ``core.log_flusher`` actor calls it every ``FLUSH_SECONDS``), and
at exit.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import TextIO

FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
BATCH_RECORDS = 256
FLUSH_SECONDS = 0.25


class SecondCachedFormatter(logging.Formatter):
    """``Formatter`` whose ``%(asctime)s`` formats the date and time once per second."""

    _second = -1
    _text = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return self.stamp(record.created)

    def stamp(self, created: float) -> str:
        """``2026-11-23 21:30:43,981`` for the Unix time ``created``."""
        second = int(created)
        if second != self._second:
            self._second = second
            self._text = time.strftime("%Y-%m-%d %H:%M:%S", self.converter(created))
        return f"{self._text},{int((created - second) * 1000):03d}"


class BatchedStreamHandler(logging.Handler):
    """A ``StreamHandler`` that writes its lines in batches (see the module docstring)."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self._stream = stream
        self._lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._lines.append(self.format(record))
        except Exception:
            self.handleError(record)
            return
        if len(self._lines) >= BATCH_RECORDS or record.levelno >= logging.WARNING:
            self.flush()

    def add_line(self, line: str) -> None:
        """Take a line formatted already (the access log's, see ``access_writer``)."""
        self._lines.append(line)
        if len(self._lines) >= BATCH_RECORDS:
            self.flush()

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            if not self._lines:
                return
            lines, self._lines = self._lines, []
            try:
                self._stream.write("\n".join(lines) + "\n")
                self._stream.flush()
            except (OSError, ValueError):  # stderr closed: nothing sensible is left to do
                pass


def configure_logging(level: str, stream: TextIO | None = None) -> None:
    """Log at ``level`` and above to ``stream`` (stderr) through a ``BatchedStreamHandler``."""
    logging._srcfile = None  # no caller lookup per record: no line shows it
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = BatchedStreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(SecondCachedFormatter(FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
    # Alembic narrates every plugin it loads at INFO; upgrades are still logged at WARNING+.
    logging.getLogger("alembic").setLevel(logging.WARNING)


def access_writer(logger: logging.Logger) -> Callable[[str], None]:
    """How the pipeline writes one access line (an INFO message of ``logger``; the caller
    checks ``logger.isEnabledFor(logging.INFO)`` first).

    When ``logger`` ends in ``configure_logging``'s handler alone, lines go straight into
    that handler's batch with the same prefix a record would get, without a ``LogRecord``
    for each request (it cost a request more than the rest of its access line); otherwise
    (tests capturing logs, other handlers) through ``logger.info``.
    """
    root = logging.getLogger()
    handlers = root.handlers
    if logger.handlers or logger.filters or not logger.propagate or len(handlers) != 1 \
            or not isinstance(handlers[0], BatchedStreamHandler) or root.filters \
            or handlers[0].filters:
        return logger.info
    handler = handlers[0]
    formatter = handler.formatter
    assert isinstance(formatter, SecondCachedFormatter)
    name = logger.name

    def write(line: str) -> None:
        handler.add_line(f"{formatter.stamp(time.time())} INFO {name} {line}")

    return write


def flush_logs() -> None:
    """Write what the root logger's handlers hold."""
    for handler in logging.getLogger().handlers:
        handler.flush()
