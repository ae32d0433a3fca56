"""The ``[plugins.projects]`` settings table."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from runtime.config import Section


class ProjectsSettings(Section):
    """Agent runs, the run queue and the live stream.

    ``docs/projects.md`` documents every key.
    """

    backend: Literal["offline", "openai"] = "offline"
    model_base_url: str = ""
    model: str = ""
    model_api_key: str = ""
    model_timeout_seconds: float = Field(60.0, gt=0)
    max_turns: int = Field(40, ge=1, le=100_000)
    run_slots: int = Field(2, ge=1, le=256)
    dedicated_slots: int = Field(2, ge=0, le=256)
    run_timeout_seconds: float = Field(1800.0, gt=0)
    lease_seconds: float = Field(30.0, ge=1)
    workspace_root: Path = Path("")
    allow_commands: bool = True
    command_timeout_seconds: float = Field(30.0, gt=0)
    replay_events: int = Field(1000, ge=10, le=100_000)
    heartbeat_seconds: float = Field(15.0, gt=0)
    retry_ms: int = Field(3000, ge=0)
    subscriber_max_lag: int = Field(500, ge=1)
    subscriber_write_timeout_seconds: float = Field(10.0, gt=0)
    streams_per_client: int = Field(32, ge=1)
    subscriber_queued_bytes: int = Field(64 * 1024 * 1024, ge=1024 * 1024)
    faster_heartbeat_seconds: float = Field(5.0, gt=0)
    faster_retry_ms: int = Field(1000, ge=0)
    stream_idle_seconds: float = Field(30.0, gt=0)
    fetch_allow_http: bool = True
    fetch_allowed_hosts: list[str] = []
    fetch_allowed_networks: list[str] = []
    fetch_timeout_seconds: float = Field(15.0, gt=0, le=300)
    fetch_max_bytes: int = Field(1_048_576, ge=1024, le=64 * 1024 * 1024)
    preview_base_url: str = ""

    @field_validator("model_base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")

    @field_validator("preview_base_url")
    @classmethod
    def _preview_origin(cls, value: str) -> str:
        if not value:
            return value
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname \
                or parts.path.strip("/") or parts.query or parts.fragment or "@" in parts.netloc:
            raise ValueError("must be an origin such as https://preview.example-usercontent.net "
                             "(http or https, a host, no path)")
        return value.rstrip("/")

    @field_validator("fetch_allowed_networks")
    @classmethod
    def _networks_parse(cls, networks: list[str]) -> list[str]:
        for network in networks:
            ipaddress.ip_network(network)  # ValueError names the bad network
        return networks

    @model_validator(mode="after")
    def _model_configured(self) -> ProjectsSettings:
        if self.backend == "openai" and not (self.model_base_url and self.model):
            raise ValueError("backend = \"openai\" needs model_base_url and model")
        return self

    def workspaces(self, var_dir: Path) -> Path:
        """Where project workspaces live: ``workspace_root``, or ``<var_dir>/workspaces``."""
        return self.workspace_root if str(self.workspace_root) not in ("", ".") \
            else var_dir / "workspaces"
