"""Refused logins: an authorization identity is refused (as RabbitMQ), consecutive failures from one address are
answered more and more slowly (not other addresses, nor successful logins), and the log names the user."""

from __future__ import annotations

import select
import socket
import time

import pytest
from pamqp import commands

from tests.integration.rawclient import PeerClosed, RawClient, describe, plain_response
from tests.waiting import TIMER_GRAIN, wait_for

DELAY = 0.5  # failed_login_delay of the brokers started here


def start_ok(client: RawClient, response: str, mechanism: str = "PLAIN") -> float:
    """Log in up to start-ok; the time.monotonic() just before start-ok was sent."""
    client.send_protocol_header()
    client.expect(commands.Connection.Start)
    sent = time.monotonic()
    client.send(0, commands.Connection.StartOk(
        client_properties={"capabilities": {"authentication_failure_close": True}}, mechanism=mechanism,
        response=response))
    return sent


def refusal(client: RawClient) -> str:
    """How the broker refused the login: 'ACCESS_REFUSED' (connection.close 403) or 'closed' (the socket)."""
    try:
        _, value = client.read_frame(timeout=10)
    except PeerClosed:
        return "closed"
    assert isinstance(value, commands.Connection.Close), f"expected a refusal, got {describe(value)}"
    assert value.reply_code == 403, describe(value)
    client.send(0, commands.Connection.CloseOk())
    return "ACCESS_REFUSED"


def connect_from(broker, address: str) -> RawClient:
    """A client whose connections come from another loopback address, so that the broker counts it apart."""
    sock = socket.create_connection((broker.host, broker.port), timeout=10, source_address=(address, 0))
    return RawClient(sock, timeout=10)


@pytest.fixture
def throttled(own_broker, tmp_path):
    config = tmp_path / "warren.toml"
    config.write_text(f"[amqp]\nfailed_login_delay = {DELAY}\n")
    return own_broker("--config", str(config))


@pytest.mark.parametrize("response", ["guest\0guest\0guest", "admin\0guest\0guest"],
                         ids=["own-identity", "other-identity"])
def test_plain_with_an_authorization_identity_is_refused(broker, response):
    with RawClient.connect(broker, timeout=10) as client:
        start_ok(client, response)
        refusal(client)  # RabbitMQ closes the socket (a syntax error), Warren answers 403; never connection.tune


def test_consecutive_failures_from_one_address_are_answered_more_and_more_slowly(throttled):
    waits = []
    for _ in range(3):
        with RawClient.connect(throttled, timeout=15) as client:
            sent = start_ok(client, plain_response("guest", "wrong"))
            assert refusal(client) == "ACCESS_REFUSED"  # as before, only later
            waits.append(time.monotonic() - sent)
    assert waits[1] >= DELAY - TIMER_GRAIN and waits[2] >= 2 * DELAY - TIMER_GRAIN, waits  # the first: at once


def test_other_addresses_and_successful_logins_are_not_slowed(throttled):
    for _ in range(4):  # the next failure from 127.0.0.1 waits 4 * DELAY
        with RawClient.connect(throttled, timeout=15) as client:
            start_ok(client, plain_response("guest", "wrong"))
            refusal(client)
    with RawClient.connect(throttled, timeout=15) as slowed:
        start_ok(slowed, plain_response("guest", "wrong"))
        # its refusal counted first (logged as the count is asked for): with several workers a success from the
        # address, which starts the count over, could otherwise reach the supervisor before it
        wait_for(lambda: f"127.0.0.1:{slowed.sock.getsockname()[1]}" in throttled.log(), what="the refusal logged")
        with connect_from(throttled, "127.0.0.2") as other:  # a first failure from its address: answered at once
            start_ok(other, plain_response("guest", "wrong"))
            assert refusal(other) == "ACCESS_REFUSED"
        with RawClient.connect(throttled) as good:  # a good login from the slowed address is never delayed
            good.handshake()
            good.open_channel(1)
        assert select.select([slowed.sock], [], [], 0)[0] == [], "the slowed refusal should still be waiting"
        assert refusal(slowed) == "ACCESS_REFUSED"


def test_the_log_names_the_user_the_peer_and_the_mechanism_in_one_line(throttled):
    with RawClient.connect(throttled, timeout=15) as client:
        start_ok(client, plain_response("mallory", "guess"))
        port = client.sock.getsockname()[1]
        refusal(client)
    lines = [line for line in throttled.log().splitlines() if "mallory" in line]
    assert len(lines) == 1, lines
    assert f"login refused for user 'mallory' from 127.0.0.1:{port} (mechanism 'PLAIN')" in lines[0]
