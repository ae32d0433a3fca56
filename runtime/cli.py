"""The ``flowsvc`` command: serve, migrate, plugins, doctor, and the commands plugins add.

The configuration file is found the same way from any working directory: ``--config``
(before or after the sub-command), else ``$FLOWSVC_CONFIG``, else ``./config.toml`` when
there is one, else the built-in defaults (every built-in plugin enabled).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from runtime.config import ConfigError, Settings, load_settings
from runtime.hooktypes import Command
from runtime.logs import configure_logging

if TYPE_CHECKING:
    from quart import Blueprint

DEFAULT_CONFIG = Path("config.toml")
CONFIG_VARIABLE = "FLOWSVC_CONFIG"


def config_path(raw: str | None, environ: dict[str, str]) -> Path | None:
    """Where the configuration is read from (see the module docstring); None: defaults."""
    if raw:
        return Path(raw)
    if environ.get(CONFIG_VARIABLE):
        return Path(environ[CONFIG_VARIABLE])
    return DEFAULT_CONFIG if DEFAULT_CONFIG.exists() else None


async def _migrate(settings: Settings) -> int:
    from runtime.bootstrap import open_service

    async with open_service(settings, migrate=True):
        pass
    print("migrations applied")
    return 0


async def _doctor(settings: Settings) -> int:
    """Say what this host offers the service's tools; 1 when something is missing."""
    from runtime.sandbox import Sandbox

    sandbox = Sandbox(settings.sandbox)
    await sandbox.probe()
    for need, state in sandbox.health().items():
        if need != "ok":
            print(f"sandbox {need}: {state}")
    return 1 if sandbox.reasons else 0


async def _plugins(settings: Settings) -> int:
    from runtime.bootstrap import open_service
    from runtime.hookspecs import describe_hooks
    from runtime.plugins import requirements

    hooks = describe_hooks()
    async with open_service(settings, migrate=False) as service:
        for name, plugin in service.pm.list_name_plugin():
            implemented = sorted(caller.name for caller in service.pm.get_hookcallers(plugin) or []
                                 if caller.name in hooks)
            print(f"{name}: {getattr(plugin, '__name__', type(plugin).__name__)}")
            print(f"  requires: {', '.join(requirements(plugin)) or '-'}")
            provides = getattr(plugin, "flowsvc_provides", None)
            if provides is not None:
                names = [item.contract.name for item in provides(service=service) or []]
                print(f"  provides: {', '.join(names)}")
            print(f"  hooks: {', '.join(implemented) or '-'}")
            actors = getattr(plugin, "flowsvc_actors", None)
            if actors is not None:
                print(f"  actors: {', '.join(spec.name for spec in actors(service=service) or [])}")
            blueprints = getattr(plugin, "flowsvc_blueprints", None)
            for blueprint in (blueprints(service=service) or []) if blueprints else []:
                print(f"  routes ({blueprint.name}):")
                for rule in sorted(_blueprint_rules(blueprint)):
                    print(f"    {rule}")
    return 0


def _blueprint_rules(blueprint: Blueprint) -> list[str]:
    from quart import Quart

    app = Quart("introspection")
    app.register_blueprint(blueprint)
    return [f"{' '.join(sorted((rule.methods or set()) - {'HEAD', 'OPTIONS'}))} {rule.rule}"
            for rule in app.url_map.iter_rules() if rule.endpoint != "static"]


_CONFIG_HELP = (f"path of config.toml (default: ${CONFIG_VARIABLE}, else ./config.toml if "
                "present, else the built-in defaults)")


def build_parser(commands: Sequence[Command]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flowsvc", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help=_CONFIG_HELP)
    sub = parser.add_subparsers(dest="command", required=True)

    def command_parser(name: str, help: str) -> argparse.ArgumentParser:
        # --config after the sub-command too; SUPPRESS keeps one given before it.
        added = sub.add_parser(name, help=help)
        added.add_argument("--config", default=argparse.SUPPRESS, help=_CONFIG_HELP)
        return added

    serve = command_parser("serve", "serve HTTP and run the actors")
    serve.add_argument("--bind", help="HOST:PORT (default from [service] bind); public_url "
                                      "follows it unless set")
    serve.add_argument("--workers", type=int, help="service processes (more than 1 needs Redis)")
    command_parser("migrate", "apply database migrations of every enabled plugin")
    command_parser("plugins", "list enabled plugins with what they require and provide, their "
                              "hooks, actors and routes")
    command_parser("doctor", "check what this host offers: the command sandbox and the browser "
                             "(exit status 1 when one is unavailable)")
    for command in commands:
        command.add_arguments(command_parser(command.name, command.help))
    return parser


def _plugin_commands(settings: Settings) -> list[Command]:
    from runtime.plugins import get_plugin_manager

    manager = get_plugin_manager(settings.plugins.enabled)
    return [command for commands in manager.hook.flowsvc_commands() for command in commands or []]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    pre.add_argument("--bind")
    known, _ = pre.parse_known_args(argv)
    refused: list[BaseException] = []
    try:
        # --bind is read before the settings so that public_url follows it.
        bind = {"FLOWSVC_SERVICE_BIND": known.bind} if known.bind else {}
        settings = load_settings(config_path(known.config, dict(os.environ)),
                                 {**os.environ, **bind})
        commands = _plugin_commands(settings)
        args = build_parser(commands).parse_args(argv)
        configure_logging(settings.service.log_level)
        return _dispatch(settings, args, commands)
    except* ConfigError as group:
        # Raised before anything runs, or while starting inside a nursery (a plugin's
        # start-up check): one line each.
        refused = _leaves(group)
    for exc in refused:
        print(f"flowsvc: {exc}", file=sys.stderr)
    return 2


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


def _dispatch(settings: Settings, args: argparse.Namespace, commands: list[Command]) -> int:
    from runtime.server import check_workers, run_server, serve_workers
    from runtime.shared import probe_redis

    if args.command == "doctor":
        return trio.run(_doctor, settings)
    if settings.redis.url and args.command != "plugins":
        trio.run(probe_redis, settings.redis.url)
    if args.command == "serve":
        workers = args.workers or settings.service.workers
        bind = settings.service.bind
        if workers > 1:
            check_workers(settings, workers)  # before migrating anything
            trio.run(_migrate, settings)
            return serve_workers(settings, getattr(args, "config", None), bind, workers)
        return trio.run(partial(run_server, settings, bind=bind))
    if args.command == "migrate":
        return trio.run(_migrate, settings)
    if args.command == "plugins":
        return trio.run(_plugins, settings)
    command = next(c for c in commands if c.name == args.command)
    return trio.run(_run_command, settings, command, args)


async def _run_command(settings: Settings, command: Command, args: argparse.Namespace) -> int:
    from runtime.bootstrap import open_service

    async with open_service(settings) as service:
        return await command.run(service, args)


if __name__ == "__main__":
    sys.exit(main())
