"""Contracts: what one plugin offers the others, declared here so nobody imports a provider.

A contract is either

- an **interface** (a ``typing.Protocol``) named by a typed :class:`Contract` key: the
  provider returns a :class:`Provision` from ``flowsvc_provides`` and consumers get it
  with ``service.contract(KEY)`` (pytest's ``StashKey``, datasette's named plugins);
- or an **actor address** with typed messages: the actor's registry name and its message
  dataclasses live in the contract module; callers send them with ``Address.call`` /
  ``cast``, and a ``runtime.actors.Request[R]`` message types its reply ``R``;
- or a **hook** in ``runtime.hookspecs`` (the feature flags, account events, chain
  transfers).

A plugin that uses a contract names the plugin that provides it in ``flowsvc_requires``;
the plugin manager refuses to start without it. The contracts (one module each):

| module | contract | provided by | reached through |
|---|---|---|---|
| ``runs`` | start, read and stream agent runs | projects | ``AGENT_RUNS`` interface |
| ``projects`` | a project an agent can be made from | projects | ``PROJECTS`` interface |
| ``meter`` | charge FLOW to an API key | keys | ``keys.meter`` actor |
| ``messenger`` | send a user a message through the bot | auth | ``auth.messenger`` actor |
| ``tokens`` | the token registry | chain | ``TOKENS`` interface |
| ``chain`` | final token transfers to watched addresses | chain | ``flowsvc_chain_*`` hooks |
| ``features`` | a user's feature flags | billing (any) | ``flowsvc_user_features`` hook |
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Contract(Generic[T]):
    """The typed name of an interface one plugin provides to others.

    :param name: a short name for messages (``"agent runs"``).
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Contract({self.name!r})"


@dataclass(frozen=True)
class Provision(Generic[T]):
    """What ``flowsvc_provides`` returns: the implementation of one contract."""

    contract: Contract[T]
    implementation: T


def provision(contract: Contract[T], implementation: T) -> Provision[Any]:
    """A provision whose implementation is checked against the contract's type."""
    return Provision(contract, implementation)
