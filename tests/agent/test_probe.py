"""The network probe: real TCP between the sender and sink servers on 127.0.0.1."""

from __future__ import annotations

import socket

import pytest
from hopsmgr_agent.probe import MAGIC, ProbeError, ProbeSink, measure_peer, parse_peer


def test_probe_between_two_sinks(probe_sinks: list[ProbeSink]) -> None:
    nbytes = 16 << 20
    rates = [measure_peer("127.0.0.1", s.port, nbytes, timeout_s=30) for s in probe_sinks]
    assert all(r > 0 for r in rates)
    for sink in probe_sinks:
        # the warm-up message (4 MiB) and the timed one, all of it delivered before the answer
        assert sink.received == nbytes + (4 << 20)


def test_probe_to_a_closed_port_fails_with_the_address() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound but not listening: connections are refused
        with pytest.raises(ProbeError, match=f"127.0.0.1:{port}"):
            measure_peer("127.0.0.1", port, 1 << 20, timeout_s=5)


def closed_without_answer(s: socket.socket) -> bool:
    try:
        return s.recv(100) == b""
    except ConnectionResetError:  # closed with our unread bytes still in its buffer
        return True


def test_sink_ignores_strangers_and_limits_messages(probe_sinks: list[ProbeSink]) -> None:
    port = probe_sinks[0].port
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET / HTTP/1.1\r\n\r\n")
        assert closed_without_answer(s)  # not the magic
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(MAGIC + (1 << 40).to_bytes(8, "big"))
        assert closed_without_answer(s)  # over MAX_MESSAGE
    assert measure_peer("127.0.0.1", port, 1 << 20) > 0  # still serving


@pytest.mark.parametrize(
    ("text", "parsed"),
    [("gpu02:8471", ("gpu02", 8471)), ("10.0.0.3:1", ("10.0.0.3", 1)), ("[::1]:8471", ("::1", 8471))],
)
def test_parse_peer(text: str, parsed: tuple[str, int]) -> None:
    assert parse_peer(text) == parsed


@pytest.mark.parametrize("text", ["gpu02", ":8471", "gpu02:", "gpu02:65536", "gpu02:x", "a b:1", "[]:1"])
def test_parse_peer_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_peer(text)
