"""Tests of the webhook SSRF guard: every refused class, the odd forms, DNS, and the allow-lists.

Name resolution is real (``localhost`` through the system resolver); where a test needs DNS to
answer something specific, such as a rebinding attack, it installs a resolver through trio's
own ``set_custom_hostname_resolver`` hook, which our code goes through unchanged.
"""

import ipaddress

import pytest

from runtime.netguard import (
    UnsafeUrlError,
    UrlPolicy,
    check_url,
    resolve_and_check,
)
from tests.support.scripted_dns import ScriptedResolver

STRICT = UrlPolicy()
HTTP_OK = UrlPolicy(allow_http=True)


def refusal(url: str, policy: UrlPolicy = HTTP_OK) -> str:
    with pytest.raises(UnsafeUrlError) as caught:
        check_url(url, policy)
    assert str(caught.value)  # every refusal explains itself to a human
    return caught.value.reason


BLOCKED_ADDRESSES = [
    # loopback
    "127.0.0.1",
    "127.255.255.254",
    "[::1]",
    # private: RFC 1918 and unique local fc00::/7
    "10.0.0.1",
    "172.16.5.4",
    "172.31.255.255",
    "192.168.1.1",
    "[fc00::1]",
    "[fd12:3456:789a::1]",
    # link-local, including the cloud metadata address
    "169.254.169.254",
    "169.254.0.1",
    "[fe80::1]",
    "[fe80::1%25eth0]",
    # multicast
    "224.0.0.1",
    "239.255.255.250",
    "[ff02::1]",
    # unspecified
    "0.0.0.0",  # noqa: S104 -- an address to refuse, not one to bind
    "[::]",
    # reserved and broadcast
    "240.0.0.1",
    "255.255.255.255",
    # shared address space (CGNAT)
    "100.64.0.1",
    "100.127.255.254",
    # other not globally routable: "this network", documentation ranges
    "0.1.2.3",
    "192.0.2.10",
    "[2001:db8::1]",
    # IPv4 embedded in IPv6: mapped (both spellings), NAT64, 6to4
    "[::ffff:127.0.0.1]",
    "[::ffff:7f00:1]",
    "[::ffff:169.254.169.254]",
    "[::ffff:10.0.0.1]",
    "[::ffff:100.64.0.1]",
    "[64:ff9b::a9fe:a9fe]",
    "[2002:7f00:1::]",
]


@pytest.mark.parametrize("host", BLOCKED_ADDRESSES)
def test_every_forbidden_address_class_is_refused(host: str) -> None:
    assert refusal(f"https://{host}/hook") == "blocked_address"
    assert refusal(f"http://{host}:8080/hook") == "blocked_address"


@pytest.mark.parametrize(
    "url",
    [
        "http://2130706433/",  # decimal 127.0.0.1
        "http://0177.0.0.1/",  # octal first octet
        "http://0x7f.0.0.1/",  # hex first octet
        "http://0x7f000001/",  # one hex number
        "http://017700000001/",  # one octal number
        "http://127.1/",  # shortened
        "http://127.0.0.01/",  # leading zero
        "http://169.254.43518/",  # metadata address, last two octets merged
        "http://1.2.3.4.5/",
        "http://example.0x10/",
    ],
)
def test_non_canonical_ipv4_forms_are_refused(url: str) -> None:
    assert refusal(url) == "ambiguous_ip_literal"


@pytest.mark.parametrize(
    "url",
    [
        "https://metadata.google.internal/computeMetadata/v1/",
        "https://METADATA.GOOGLE.INTERNAL./computeMetadata/v1/",
        "https://instance-data.ec2.internal/latest/meta-data/",
        "https://metadata/",
        "https://metadata.goog/",
        "https://printer.local/",
        "https://router.home.arpa/",
    ],
)
def test_internal_service_names_are_refused_without_dns(url: str) -> None:
    assert refusal(url) == "blocked_hostname"


@pytest.mark.parametrize(
    "url",
    [
        "https://user@example.com/",
        "https://user:password@example.com/",
        "https://example.com@127.0.0.1/",
        "https://:@example.com/",
    ],
)
def test_userinfo_is_refused(url: str) -> None:
    assert refusal(url) == "userinfo_not_allowed"


@pytest.mark.parametrize(
    ("url", "policy"),
    [
        ("http://example.com/", STRICT),
        ("ftp://example.com/", HTTP_OK),
        ("file:///etc/passwd", HTTP_OK),
        ("gopher://127.0.0.1:6379/_INFO", HTTP_OK),
        ("javascript:alert(1)", HTTP_OK),
        ("//example.com/hook", HTTP_OK),
    ],
)
def test_schemes_other_than_https_are_refused(url: str, policy: UrlPolicy) -> None:
    assert refusal(url, policy) == "scheme_not_allowed"


@pytest.mark.parametrize(
    "url",
    [
        "",
        "https://",
        "https:///hook",
        "https://exa mple.com/",
        "https://example.com\\@127.0.0.1/",
        "https://example.com/\t",
        "https://bücher.example/",
        "https://[::1/",
        "https://example.com:99999/",
        "https://example.com:0/",
        "https://example.com:http/",
        "https://ex..ample.com/",
        "https://127%2e0%2e0%2e1/",
        "https://-bad.example.com/",
        "https://" + "a" * 64 + ".example.com/",
    ],
)
def test_malformed_urls_are_refused(url: str) -> None:
    assert refusal(url) == "invalid_url"


@pytest.mark.parametrize("url", ["https://localhost/hook", "http://LOCALHOST.:8080/hook"])
def test_a_name_resolving_to_loopback_is_refused_by_check_url(url: str) -> None:
    assert refusal(url) == "blocked_address"


@pytest.mark.parametrize(
    "url",
    [
        "https://93.184.215.14/hook",
        "https://93.184.215.14:8443/hook?token=abc#frag",
        "https://[2606:4700:4700::1111]/hook",
        "https://[::ffff:8.8.8.8]/hook",
    ],
)
def test_public_addresses_pass(url: str) -> None:
    check_url(url, STRICT)


def test_refusal_message_names_the_host_but_not_the_path_or_query() -> None:
    with pytest.raises(UnsafeUrlError) as caught:
        check_url("https://169.254.169.254/latest?token=s3cr3t", STRICT)

    assert "169.254.169.254" in str(caught.value)
    assert "link-local" in str(caught.value)
    assert "s3cr3t" not in str(caught.value)


def test_allowed_hosts_bypass_the_address_and_name_checks_only_for_those_hosts() -> None:
    policy = UrlPolicy.build(allow_http=True, allowed_hosts=["127.0.0.1"])

    check_url("http://127.0.0.1:8080/hook", policy)
    check_url("https://[::ffff:127.0.0.1]/hook", UrlPolicy.build(allowed_hosts=["::ffff:7f00:1"]))
    assert refusal("http://127.0.0.2/", policy) == "blocked_address"
    assert refusal("http://localhost/", policy) == "blocked_address"
    assert refusal("http://user@127.0.0.1/", policy) == "userinfo_not_allowed"
    assert refusal("http://2130706433/", policy) == "ambiguous_ip_literal"
    assert refusal("http://127.0.0.1/", UrlPolicy.build(allowed_hosts=["127.0.0.1"])) == (
        "scheme_not_allowed"
    )


def test_allowed_networks_bypass_the_address_checks_for_addresses_inside() -> None:
    policy = UrlPolicy.build(allow_http=True, allowed_networks=["127.0.0.0/8", "::1/128"])

    check_url("http://127.0.0.2:9000/hook", policy)
    check_url("http://[::1]:9000/hook", policy)
    check_url("http://localhost:9000/hook", policy)
    assert refusal("http://10.0.0.1/", policy) == "blocked_address"


def test_policy_build_refuses_networks_with_host_bits_set() -> None:
    with pytest.raises(ValueError, match="host bits"):
        UrlPolicy.build(allowed_networks=["10.0.0.1/8"])


# --- resolution before each delivery ---------------------------------------------------------

async def async_refusal(url: str, policy: UrlPolicy = STRICT) -> str:
    with pytest.raises(UnsafeUrlError) as caught:
        await resolve_and_check(url, policy)
    return caught.value.reason


async def test_resolve_and_check_returns_every_public_address_once(dns: ScriptedResolver) -> None:
    dns.answers["hooks.example.com"] = ["93.184.215.14", "2606:2800:21f::1", "93.184.215.14"]

    addresses = await resolve_and_check("https://hooks.example.com/in", STRICT)

    assert addresses == [
        ipaddress.ip_address("93.184.215.14"),
        ipaddress.ip_address("2606:2800:21f::1"),
    ]


async def test_one_forbidden_address_among_public_ones_refuses_the_url(
    dns: ScriptedResolver,
) -> None:
    dns.answers["hooks.example.com"] = ["93.184.215.14", "::ffff:169.254.169.254"]

    assert await async_refusal("https://hooks.example.com/in") == "blocked_address"


async def test_dns_rebinding_after_creation_is_caught_before_delivery(
    dns: ScriptedResolver,
) -> None:
    dns.answers["hooks.example.com"] = ["93.184.215.14"]
    await resolve_and_check("https://hooks.example.com/in", STRICT)

    dns.answers["hooks.example.com"] = ["10.1.2.3"]

    assert await async_refusal("https://hooks.example.com/in") == "blocked_address"


async def test_unresolvable_host_is_reported_as_such(dns: ScriptedResolver) -> None:
    assert await async_refusal("https://gone.example.com/in") == "unresolvable_host"


async def test_allow_lists_apply_to_resolved_addresses(dns: ScriptedResolver) -> None:
    dns.answers["relay.corp.example"] = ["10.1.2.3"]
    dns.answers["printer.local"] = ["192.168.1.20"]
    assert await async_refusal("https://printer.local/") == "blocked_hostname"
    assert await async_refusal("https://relay.corp.example/") == "blocked_address"
    named = UrlPolicy.build(allowed_hosts=["Printer.Local."])
    assert await resolve_and_check("https://printer.local/", named) == [
        ipaddress.ip_address("192.168.1.20")
    ]
    by_host = UrlPolicy.build(allowed_hosts=["relay.corp.example"])
    by_network = UrlPolicy.build(allowed_networks=["10.0.0.0/8"])

    assert await resolve_and_check("https://relay.corp.example/", by_host) == [
        ipaddress.ip_address("10.1.2.3")
    ]
    assert await resolve_and_check("https://relay.corp.example/", by_network) == [
        ipaddress.ip_address("10.1.2.3")
    ]


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("https://localhost/", "blocked_address"),
        ("https://169.254.169.254/", "blocked_address"),
        ("https://metadata.google.internal/", "blocked_hostname"),
        ("http://example.com/", "scheme_not_allowed"),
        ("https://0177.0.0.1/", "ambiguous_ip_literal"),
    ],
)
async def test_resolve_and_check_applies_the_same_rules_with_the_system_resolver(
    url: str, reason: str
) -> None:
    assert await async_refusal(url) == reason


async def test_literal_addresses_are_returned_as_they_are() -> None:
    assert await resolve_and_check("https://[2606:4700:4700::1111]:8443/", STRICT) == [
        ipaddress.ip_address("2606:4700:4700::1111")
    ]
