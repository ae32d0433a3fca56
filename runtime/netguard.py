"""SSRF guard for URLs that users choose and our servers fetch (webhook targets, ``fetch_url``).

Such a URL must never reach our own network: loopback, private and link-local ranges (the
cloud metadata service at 169.254.169.254 among them), and the names that lead there. Two
checks use the same rules:

* :func:`check_url` when a URL is stored (a webhook subscription: syntax, scheme, then DNS);
* :func:`resolve_and_check` before every request, because DNS answers change (rebinding). It
  returns the vetted addresses; the caller connects to one of those rather than let the HTTP
  client resolve the name again (``runtime.outbound`` does), and checks every redirect's
  target again, since a redirect leads to a URL this guard never saw.

Numeric host forms that resolvers read differently from humans (``2130706433``, ``0177.0.0.1``,
``127.1``, ``0x7f.0.0.1``) are refused rather than normalized: the only IPv4 literal accepted is
the canonical dotted quad. Error messages name the host, never the full URL, whose path or query
may carry the integrator's own token.
"""

import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import SplitResult, urlsplit

import trio

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

UnsafeUrlReason = Literal[
    "invalid_url",
    "scheme_not_allowed",
    "userinfo_not_allowed",
    "ambiguous_ip_literal",
    "blocked_hostname",
    "blocked_address",
    "unresolvable_host",
]

_DEFAULT_PORTS = {"http": 80, "https": 443}
# Printable ASCII without space or backslash: control characters, whitespace and "\" are
# parsed differently by different URL parsers, which is how guards get bypassed.
_URL_CHARS = re.compile(r"[!-\[\]-~]+")
_LABEL = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?")
_NUMERIC_LABEL = re.compile(r"[0-9]+|0x[0-9a-f]*")
# Names that only ever lead inside a network: ICANN's private-use TLD `.internal` (GCP's
# metadata.google.internal, AWS's *.ec2.internal), mDNS `.local` and RFC 8375 `.home.arpa`.
_BLOCKED_SUFFIXES = ("internal", "local", "home.arpa")
_BLOCKED_NAMES = frozenset({"metadata", "metadata.goog", "instance-data"})
_SHARED_ADDRESS_SPACE = ipaddress.IPv4Network("100.64.0.0/10")
_NAT64_PREFIX = ipaddress.IPv6Network("64:ff9b::/96")


class UnsafeUrlError(ValueError):
    """A URL was refused. ``reason`` is stable and meant for code:

    ``invalid_url``, ``scheme_not_allowed``, ``userinfo_not_allowed``, ``ambiguous_ip_literal``,
    ``blocked_hostname``, ``blocked_address`` or ``unresolvable_host``. The message is for
    humans and says what was wrong.
    """

    def __init__(self, reason: UnsafeUrlReason, message: str) -> None:
        super().__init__(message)
        self.reason: UnsafeUrlReason = reason


def normalize_host(host: str) -> str:
    """Lowercase, drop one trailing dot, and write IP literals canonically."""
    host = host.lower().removesuffix(".")
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host


@dataclass(frozen=True)
class UrlPolicy:
    """What targets the operator permits, for one use (``purpose`` names it in messages).

    ``allow_http`` admits ``http://`` besides ``https://``. ``allowed_hosts`` (names or IP
    literals) and ``allowed_networks`` (CIDR) bypass the address and name checks, for targets
    the operator trusts, such as an internal relay or 127.0.0.1 in tests; scheme, syntax and
    userinfo checks still apply. Build from configuration strings with :meth:`build`.
    """

    allow_http: bool = False
    purpose: str = "outbound requests"
    allowed_hosts: frozenset[str] = field(default_factory=frozenset)
    allowed_networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def build(
        cls,
        *,
        allow_http: bool = False,
        allowed_hosts: Iterable[str] = (),
        allowed_networks: Iterable[str] = (),
        purpose: str = "outbound requests",
    ) -> "UrlPolicy":
        """Return a policy from configuration strings.

        Hosts are normalized like URL hosts. Raises ``ValueError`` for a network with host bits
        set (``10.0.0.1/8``), which is more likely a typo than an intent.
        """
        return cls(
            allow_http=allow_http,
            allowed_hosts=frozenset(normalize_host(host) for host in allowed_hosts),
            allowed_networks=tuple(ipaddress.ip_network(net) for net in allowed_networks),
            purpose=purpose,
        )

    def trusts(self, address: IPAddress) -> bool:
        """Whether ``address`` lies in an operator-allowed network."""
        return any(address in network for network in self.allowed_networks)


@dataclass(frozen=True)
class _Target:
    """A syntactically vetted URL: its normalized host, port, and the address if a literal."""

    host: str
    port: int
    literal: IPAddress | None
    host_allowed: bool


def _split(url: str) -> tuple[SplitResult, int | None]:
    """Parse ``url`` into parts and explicit port; raise ``UnsafeUrlError("invalid_url")``."""
    if not _URL_CHARS.fullmatch(url):
        raise UnsafeUrlError(
            "invalid_url",
            "URL must be ASCII without spaces, control characters or backslashes "
            "(write international domain names in punycode)",
        )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # bad brackets around an IPv6 host, or a port out of range
        raise UnsafeUrlError("invalid_url", f"URL cannot be parsed: {exc}") from exc
    if port == 0:
        raise UnsafeUrlError("invalid_url", "URL port must be between 1 and 65535")
    return parts, port


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address that an IPv6 form leads to: IPv4-mapped, NAT64 or 6to4."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64_PREFIX:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address.sixtofour


def _why_blocked(address: IPAddress) -> str | None:
    """Say why ``address`` is forbidden ("is loopback", ...), or ``None`` if it is public."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            inner = _why_blocked(embedded)
            return None if inner is None else f"leads to {embedded}, which {inner}"
    # Order matters where ranges overlap: 169.254.0.0/16 and 240.0.0.0/4 are also "private" to
    # Python, but "link-local" and "reserved" say more.
    checks: tuple[tuple[bool, str], ...] = (
        (address.is_loopback, "is loopback"),
        (address.is_unspecified, "is unspecified"),
        (address.is_link_local, "is link-local (where cloud metadata services live)"),
        (address.is_multicast, "is multicast"),
        (address in _SHARED_ADDRESS_SPACE, "is in the CGNAT shared address space 100.64.0.0/10"),
        (address.is_reserved, "is reserved"),
        (address.is_private, "is private"),
        (not address.is_global, "is not globally routable"),
    )
    return next((why for hit, why in checks if hit), None)


def _check_address(address: IPAddress, target: _Target, policy: UrlPolicy) -> None:
    """Raise ``UnsafeUrlError("blocked_address")`` unless ``address`` may be contacted."""
    if target.host_allowed or policy.trusts(address):
        return
    why = _why_blocked(address)
    if why is None:
        return
    if target.literal is not None:
        subject = f"address {address}"
    else:
        subject = f"host {target.host!r} resolves to {address}, which"
    raise UnsafeUrlError(
        "blocked_address", f"{subject} {why}; {policy.purpose} must target public addresses"
    )


def _vet_syntax(url: str, policy: UrlPolicy) -> _Target:
    """Apply every check that needs no DNS; return the target to resolve."""
    parts, explicit_port = _split(url)
    scheme = parts.scheme.lower()
    allowed_schemes = ("https", "http") if policy.allow_http else ("https",)
    if scheme not in allowed_schemes:
        raise UnsafeUrlError(
            "scheme_not_allowed", f"URL scheme must be {' or '.join(allowed_schemes)}"
        )
    if "@" in parts.netloc:
        raise UnsafeUrlError("userinfo_not_allowed", "URL must not contain a user name or password")
    if not parts.hostname:
        raise UnsafeUrlError("invalid_url", "URL has no host")
    host = normalize_host(parts.hostname)
    port = _DEFAULT_PORTS[scheme] if explicit_port is None else explicit_port
    host_allowed = host in policy.allowed_hosts
    try:
        literal: IPAddress | None = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    target = _Target(host=host, port=port, literal=literal, host_allowed=host_allowed)
    if literal is None:
        _vet_hostname(host, host_allowed)
    else:
        _check_address(literal, target, policy)
    return target


def _vet_hostname(host: str, host_allowed: bool) -> None:
    """Refuse numeric look-alikes, malformed names and names that only lead inside."""
    labels = host.split(".")
    # Like browsers (WHATWG "ends in a number"), treat a host whose last label is numeric as an
    # IPv4 literal; not being a canonical dotted quad, it is one of the odd forms.
    if _NUMERIC_LABEL.fullmatch(labels[-1]):
        raise UnsafeUrlError(
            "ambiguous_ip_literal",
            f"host {host!r} is a non-canonical IPv4 form; write the address as a.b.c.d",
        )
    if len(host) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise UnsafeUrlError("invalid_url", f"host {host!r} is not a valid DNS name")
    if host_allowed:
        return
    if host in _BLOCKED_NAMES or any(
        host == suffix or host.endswith("." + suffix) for suffix in _BLOCKED_SUFFIXES
    ):
        raise UnsafeUrlError("blocked_hostname", f"host {host!r} names an internal service")


def _vet_addresses(
    target: _Target, infos: Iterable[tuple[Any, ...]], policy: UrlPolicy
) -> list[IPAddress]:
    """Check every resolved address (an attacker needs only one bad one); return them deduped."""
    addresses: list[IPAddress] = []
    for info in infos:
        address = ipaddress.ip_address(info[4][0])  # getaddrinfo's sockaddr starts with the IP
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise UnsafeUrlError("unresolvable_host", f"host {target.host!r} has no address")
    for address in addresses:
        _check_address(address, target, policy)
    return addresses


def _unresolvable(target: _Target, exc: OSError) -> UnsafeUrlError:
    return UnsafeUrlError("unresolvable_host", f"host {target.host!r} does not resolve: {exc}")


def check_url(url: str, policy: UrlPolicy) -> None:
    """Refuse ``url`` unless it is safe, resolving its host with DNS.

    Meant for when a URL is stored (a webhook subscription). It blocks on DNS: from async
    code run it in a thread (``trio.to_thread.run_sync``) or ``await resolve_and_check``
    instead. Raises
    ``UnsafeUrlError``; its ``reason`` says which rule refused the URL.
    """
    target = _vet_syntax(url, policy)
    if target.literal is not None:
        return
    try:
        infos = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise _unresolvable(target, exc) from exc
    _vet_addresses(target, infos, policy)


async def resolve_and_check(url: str, policy: UrlPolicy) -> list[IPAddress]:
    """Resolve ``url``'s host now and return its addresses once every one is permitted.

    Call before every request: DNS may have changed since the URL was stored. Connect to a
    returned address (keeping the host name for TLS and ``Host``) so no second lookup can
    differ. Raises ``UnsafeUrlError``; ``unresolvable_host`` at request time is a network
    failure to retry, the other reasons are permanent.
    """
    target = _vet_syntax(url, policy)
    if target.literal is not None:
        return [target.literal]
    try:
        infos = await trio.socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise _unresolvable(target, exc) from exc
    return _vet_addresses(target, infos, policy)
