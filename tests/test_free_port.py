"""The tests' free ports: two servers a test starts on "two" free ports never share one."""

from tests.support.server import claim_port, free_port


def test_free_port_never_hands_out_a_port_twice() -> None:
    # 400 draws from the kernel's ~14,000 free ports of one parity: without the memory of
    # what was handed out, a repeat is all but certain (the birthday bound is about 5).
    ports = [free_port() for _ in range(400)]

    assert len(set(ports)) == len(ports)
    assert not any(claim_port(port) for port in ports)
