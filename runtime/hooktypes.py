"""The data types hooks return, kept apart from the modules that act on them.

``runtime.hookspecs`` names these in its signatures; they depend on nothing above
``runtime.config``, so the hookspecs, the service and the CLI import them without
importing each other.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runtime.config import Section

if TYPE_CHECKING:
    from runtime.service import Service


@dataclass(frozen=True)
class PluginConfig:
    """What ``flowsvc_plugin_config`` returns: the plugin's name and settings model."""

    name: str
    model: type[Section]


@dataclass(frozen=True)
class ReadinessCheck:
    """A named readiness probe; ``check`` raises when not ready or returns details."""

    name: str
    check: Callable[[], Awaitable[dict[str, Any] | None]]


@dataclass(frozen=True)
class Command:
    """An operator command added by a plugin through ``flowsvc_commands``.

    :param name: the sub-command (``access-codes``).
    :param help: one line for ``flowsvc --help``.
    :param add_arguments: adds its arguments (and sub-commands) to its parser.
    :param run: does the work on an open service (no actors, no HTTP); returns the exit code.
    """

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[Service, argparse.Namespace], Awaitable[int]]
