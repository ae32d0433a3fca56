"""Settings: ``config.toml`` read once, overridden from the environment, validated at start.

Every key lives in a frozen pydantic model that forbids unknown keys, so a misspelt key
stops the start with a message naming it (hypercorn's ``Config.from_mapping`` silently
ignores one; we do not). Every key ``[section] key`` can be overridden by the
environment variable ``FLOWSVC_SECTION_KEY`` (``[plugins.auth] bot_token`` by
``FLOWSVC_PLUGINS_AUTH_BOT_TOKEN``). ``docs/configuration.md`` documents every key.
"""

from __future__ import annotations

import json
import os
import secrets
import tomllib
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

ENV_PREFIX = "FLOWSVC"
BUILTIN_PLUGINS = ("auth", "keys", "projects", "webhooks", "marketplace", "chain", "billing",
                   "console")
# Variables of the FLOWSVC_ prefix that are not settings: where the config file is, hook
# tracing, and the test suite's own (FLOWSVC_TEST_*).
RESERVED_VARIABLES = ("FLOWSVC_CONFIG", "FLOWSVC_TRACE_HOOKS")
RESERVED_PREFIXES = ("FLOWSVC_TEST_",)
MIN_SECRET_BYTES = 32


class ConfigError(Exception):
    """Raised when the configuration cannot be read or a key or value is wrong."""


class Section(BaseModel):
    """Base of every settings table: frozen, and unknown keys are an error."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def _url_with_scheme(value: str, schemes: tuple[str, ...], empty_means: str) -> str:
    """Check a URL setting early: a wrong one would only fail at first use, far from its key."""
    if value and not value.startswith(schemes):
        raise ValueError(f"must start with {' or '.join(schemes)} (or be empty: {empty_means})")
    return value


class ServiceSettings(Section):
    bind: str = "127.0.0.1:8000"
    workers: int = Field(1, ge=1, le=64)
    # Empty: derived from bind (http://HOST:PORT, 127.0.0.1 for a wildcard host).
    public_url: str = ""
    var_dir: Path = Path("var")
    max_body_bytes: int = Field(1_048_576, ge=1024)
    shutdown_grace_seconds: float = Field(10.0, ge=0)
    # How long a draining process waits for the runs it executes (runtime.drain).
    drain_seconds: float = Field(30.0, ge=0)
    db_threads: int = Field(4, ge=1, le=64)
    # Connections (docs/failure-behaviour.md, "Idle and slow clients").
    keep_alive_timeout_seconds: float = Field(75.0, gt=0)
    body_timeout_seconds: float = Field(30.0, gt=0)
    max_connections: int = Field(0, ge=0)  # 0: the descriptor limit less a reserve
    readiness_timeout_seconds: float = Field(2.0, gt=0)
    trusted_proxies: list[str] = []
    cookie_secure: bool = True
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # What this deployment is for. Tools that must never run for real users (a test clock,
    # a generated development wallet) refuse to work in "production".
    environment: Literal["production", "development", "test"] = "development"

    @field_validator("bind")
    @classmethod
    def _bind_form(cls, value: str) -> str:
        if value.startswith("fd://"):
            valid = value[5:].isdigit()
        elif value.startswith("unix:"):
            valid = len(value) > 5
        else:
            _host, colon, port = value.rpartition(":")
            valid = bool(colon) and port.isdigit() and int(port) <= 65535
        if not valid:
            raise ValueError("must be HOST:PORT, unix:PATH or fd://N")
        return value

    @field_validator("public_url")
    @classmethod
    def _public_url_form(cls, value: str) -> str:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https:// (or be empty: from bind)")
        return value

    @model_validator(mode="after")
    def _public_url_from_bind(self) -> ServiceSettings:
        if not self.public_url:
            object.__setattr__(self, "public_url", url_of_bind(self.bind))
        return self


def url_of_bind(bind: str) -> str:
    """The URL clients reach a ``HOST:PORT`` bind at: a wildcard host is this machine's
    loopback; a socket or an inherited descriptor gives the default port's URL."""
    host, colon, port = bind.rpartition(":")
    if not colon or bind.startswith(("fd://", "unix:")):
        return "http://127.0.0.1:8000"
    if host in ("", "0.0.0.0", "[::]", "::"):  # noqa: S104 - a bind read, not made
        host = "127.0.0.1"
    return f"http://{host}:{port}"


class DatabaseSettings(Section):
    url: str = ""
    migrate_on_start: bool = True
    # Deadlines (docs/failure-behaviour.md, "Hung dependencies").
    connect_timeout_seconds: float = Field(3.0, ge=2)  # libpq counts whole seconds, at least 2
    timeout_seconds: float = Field(5.0, gt=0)

    @field_validator("url")
    @classmethod
    def _url_form(cls, value: str) -> str:
        return _url_with_scheme(value, ("sqlite://", "postgresql://", "postgresql+psycopg://",
                                        "postgres://"), "SQLite under var_dir")


class RedisSettings(Section):
    url: str = ""
    prefix: str = Field("flowsvc:", min_length=1, max_length=64)
    connect_timeout_seconds: float = Field(2.0, gt=0)
    timeout_seconds: float = Field(2.0, gt=0)

    @field_validator("url")
    @classmethod
    def _url_form(cls, value: str) -> str:
        return _url_with_scheme(value, ("redis://", "rediss://", "unix://", "redis+cluster://",
                                        "rediss+cluster://"), "in-process shared state")


class JwtSettings(Section):
    secret: str = ""
    session_days: int = Field(30, ge=1)
    rotate_after_hours: float = Field(24.0, gt=0)


class InternalSettings(Section):
    token: str = ""


class SupervisorSettings(Section):
    max_restarts: int = Field(5, ge=0)
    within_seconds: float = Field(30.0, gt=0)
    backoff_initial_seconds: float = Field(0.1, ge=0)
    backoff_max_seconds: float = Field(5.0, ge=0)
    # A part (a plugin, one chain) is taken down past this many restarts within
    # within_seconds, and started again after part_retry_seconds, doubling to the max.
    part_max_restarts: int = Field(3, ge=0)
    part_retry_seconds: float = Field(60.0, gt=0)
    part_retry_max_seconds: float = Field(900.0, gt=0)


class LimitsSettings(Section):
    anonymous_rpm: int = Field(30, ge=0)
    authenticated_rpm: int = Field(240, ge=0)
    internal_rpm: int = Field(1000, ge=0)
    idempotency_hours: float = Field(24.0, gt=0)


class SandboxSettings(Section):
    """The command sandbox (``runtime/sandbox``, docs/agent-runtime.md): who runs it and the
    limits a sandboxed command gets unless its tool asks for less."""

    active: bool = True
    uid_base: int = Field(200_000, ge=1000)
    uid_count: int = Field(50_000, ge=1)
    cpu_seconds: int = Field(60, ge=1)
    memory_bytes: int = Field(2 * 1024**3, ge=64 * 1024**2)
    file_bytes: int = Field(256 * 1024**2, ge=1024)
    processes: int = Field(256, ge=8)
    open_files: int = Field(1024, ge=16)
    wall_seconds: float = Field(120.0, gt=0)
    output_bytes: int = Field(1024**2, ge=1024)
    workspace_bytes: int = Field(1024**3, ge=1024**2)
    tmp_bytes: int = Field(256 * 1024**2, ge=1024**2)
    browser_seconds: float = Field(30.0, ge=5)
    registries: list[str] = []


class RetentionSettings(Section):
    """The ``core.retention`` actor (``runtime.retention``)."""

    check_seconds: float = Field(3600.0, gt=0)
    partitions_ahead: int = Field(3, ge=1)


class PluginsSettings(Section):
    model_config = ConfigDict(extra="allow", frozen=True)
    enabled: list[str] = list(BUILTIN_PLUGINS)


class Settings(Section):
    """The core settings; plugin tables are validated separately by their own models."""

    service: ServiceSettings = ServiceSettings()
    database: DatabaseSettings = DatabaseSettings()
    redis: RedisSettings = RedisSettings()
    jwt: JwtSettings = JwtSettings()
    internal: InternalSettings = InternalSettings()
    supervisor: SupervisorSettings = SupervisorSettings()
    limits: LimitsSettings = LimitsSettings()
    sandbox: SandboxSettings = SandboxSettings()
    retention: RetentionSettings = RetentionSettings()
    pricing: dict[str, Decimal] = {}
    plugins: PluginsSettings = PluginsSettings()

    @property
    def database_url(self) -> str:
        """The SQLAlchemy URL; empty in config means SQLite under ``var_dir``."""
        return self.database.url or f"sqlite:///{self.service.var_dir / 'flowsvc.db'}"

    @property
    def embedded(self) -> bool:
        """True when running on SQLite with in-process shared state (one process)."""
        return not self.redis.url and self.database_url.startswith("sqlite")

    def plugin_table(self, name: str) -> dict[str, Any]:
        """The raw ``[plugins.<name>]`` table, for the plugin's own model to validate."""
        table = (self.plugins.model_extra or {}).get(name, {})
        if not isinstance(table, dict):
            raise ConfigError(f"[plugins.{name}] must be a table")
        return table


def _env_value(raw: str) -> Any:
    """Environment values are strings; lists and tables may be given as JSON."""
    stripped = raw.strip()
    if stripped.startswith(("[", "{")):
        try:
            return json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"environment value {raw!r} is not valid JSON: {exc}") from exc
    return raw


def apply_env(model: type[BaseModel], table: dict[str, Any], path: tuple[str, ...],
              environ: Mapping[str, str]) -> dict[str, Any]:
    """Overlay ``FLOWSVC_<PATH>_<KEY>`` environment variables on ``table`` for ``model``."""
    merged = dict(table)
    for name, field in model.model_fields.items():
        key_path = (*path, name)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            sub = merged.get(name, {})
            if isinstance(sub, dict):
                merged[name] = apply_env(annotation, sub, key_path, environ)
            continue
        env_name = "_".join((ENV_PREFIX, *key_path)).upper()
        if env_name in environ:
            value = _env_value(environ[env_name])
            if name == "enabled" and isinstance(value, str):
                value = [item.strip() for item in value.split(",") if item.strip()]
            merged[name] = value
    return merged


def env_names(model: type[BaseModel], path: tuple[str, ...]) -> set[str]:
    """Every ``FLOWSVC_*`` variable that sets a key of ``model`` (at ``path``)."""
    names = set()
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            names |= env_names(annotation, (*path, name))
        else:
            names.add("_".join((ENV_PREFIX, *path, name)).upper())
    return names


def check_environment(environ: Mapping[str, str], known: set[str],
                      plugin_prefixes: set[str]) -> None:
    """Refuse ``FLOWSVC_*`` variables that set nothing (a misspelt override would otherwise
    be ignored in silence).

    :param known: every variable name a setting answers to.
    :param plugin_prefixes: ``FLOWSVC_PLUGINS_<NAME>_`` of plugins that are available but
        not enabled: their variables are kept for when they are, like their tables.
    :raises ConfigError: naming each such variable.
    """
    unknown = sorted(name for name in environ
                     if name.startswith(ENV_PREFIX + "_") and name not in known
                     and name not in RESERVED_VARIABLES
                     and not name.startswith((*RESERVED_PREFIXES, *plugin_prefixes)))
    if unknown:
        raise ConfigError(f"unknown environment variable{'s' if len(unknown) > 1 else ''}: "
                          f"{', '.join(unknown)} (docs/configuration.md lists every setting)")


def _format_validation_error(where: str, exc: ValidationError) -> str:
    lines = [f"invalid configuration in {where}:"]
    for error in exc.errors():
        location = ".".join(str(part) for part in error["loc"])
        lines.append(f"  {location}: {error['msg']}")
    return "\n".join(lines)


def validate_section(model: type[Section], table: dict[str, Any], path: tuple[str, ...],
                     environ: Mapping[str, str], where: str) -> Section:
    """Validate one table (with env overrides) or raise ``ConfigError`` naming the key."""
    try:
        return model.model_validate(apply_env(model, table, path, environ))
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(where, exc)) from None


def load_settings(path: Path | None, environ: Mapping[str, str] | None = None) -> Settings:
    """Read ``path`` (or no file: defaults), apply the environment and validate.

    :raises ConfigError: the file is unreadable, or a key or value is wrong.
    """
    environ = os.environ if environ is None else environ
    table: dict[str, Any] = {}
    if path is not None:
        try:
            table = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read {path}: {exc}") from exc
    settings = validate_section(Settings, table, (), environ, str(path or "defaults"))
    assert isinstance(settings, Settings)
    return _with_secrets(settings)


def _with_secrets(settings: Settings) -> Settings:
    """Fill empty secrets: generated once under ``var/`` in the embedded default.

    Several processes must share one JWT secret and one internal token, so outside
    the embedded default an empty secret is a configuration error, not a guess.
    """
    missing = [variable for variable, value in (("FLOWSVC_JWT_SECRET", settings.jwt.secret),
                                                ("FLOWSVC_INTERNAL_TOKEN", settings.internal.token))
               if not value]
    if not settings.embedded:
        if missing:
            raise ConfigError(f"set {', '.join(missing)}: secrets are generated only in the "
                              "embedded default")
        short = [variable for variable, value in (("FLOWSVC_JWT_SECRET", settings.jwt.secret),
                                                  ("FLOWSVC_INTERNAL_TOKEN",
                                                   settings.internal.token))
                 if len(value.encode()) < MIN_SECRET_BYTES]
        if short:
            raise ConfigError(f"{', '.join(short)} must be at least {MIN_SECRET_BYTES} bytes "
                              "(a random hex string: openssl rand -hex 32)")
        return settings
    if not missing:
        return settings
    stored = _stored_secrets(settings.service.var_dir)
    jwt = settings.jwt.model_copy(update={"secret": settings.jwt.secret or stored["jwt_secret"]})
    internal = settings.internal.model_copy(
        update={"token": settings.internal.token or stored["internal_token"]})
    return settings.model_copy(update={"jwt": jwt, "internal": internal})


def _stored_secrets(var_dir: Path) -> dict[str, str]:
    """Secrets kept in ``var/secrets.json`` (mode 0600), created on first use.

    The file is written whole under a temporary name and then linked into place, so two
    commands starting at once agree on one set of secrets and neither reads half a file.
    """
    path = var_dir / "secrets.json"
    if not path.exists():
        var_dir.mkdir(parents=True, exist_ok=True)
        fresh = {"jwt_secret": secrets.token_hex(32), "internal_token": secrets.token_hex(32)}
        temporary = var_dir / f".secrets.{secrets.token_hex(8)}.json"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(fresh, handle)
            os.link(temporary, path)
        except FileExistsError:
            pass  # another process stored its secrets first: use those
        finally:
            temporary.unlink()
    stored: dict[str, str] = json.loads(path.read_text(encoding="utf-8"))
    return stored
