"""DNS answers set by a test, installed through trio's own ``set_custom_hostname_resolver``
hook, which the SSRF guard's resolution goes through unchanged (rebinding, private answers)."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence
from typing import Any

import trio

AddrInfo = tuple[Any, ...]


class ScriptedResolver(trio.abc.HostnameResolver):
    """DNS answers set by the test, installed through trio's documented resolver hook."""

    def __init__(self) -> None:
        self.answers: dict[str, Sequence[str]] = {}

    async def getaddrinfo(
        self,
        host: bytes | None,
        port: bytes | str | int | None,
        family: int = 0,
        type: int = 0,
        proto: int = 0,
        flags: int = 0,
    ) -> list[AddrInfo]:
        assert host is not None and isinstance(port, int)
        addresses = self.answers.get(host.decode())
        if addresses is None:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        infos: list[AddrInfo] = []
        for address in addresses:
            if ipaddress.ip_address(address).version == 4:
                infos.append((socket.AF_INET, type, 6, "", (address, port)))
            else:
                infos.append((socket.AF_INET6, type, 6, "", (address, port, 0, 0)))
        return infos

    async def getnameinfo(
        self, sockaddr: tuple[str, int] | tuple[str, int, int, int], flags: int
    ) -> tuple[str, str]:
        raise NotImplementedError
