"""AMQP over TLS (amqps) and the management API over HTTPS, with throwaway certificates: good handshakes with
pika and aio-pika, client certificates checked, and bad handshakes (a CA the client does not trust, an expired
certificate, plain AMQP on the TLS port) refused without harm to the broker."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
import urllib.request

import aio_pika
import pika
import pytest

from tests.conftest import REPO_ROOT, free_port, wait_for_port
from tests.integration.helpers import connect
from tests.tls_certs import make_certificates


# how a refused handshake reaches a pika client: the TLS error itself, or the connection failing
REFUSED = (pika.exceptions.AMQPConnectionError, ssl.SSLError, ConnectionError)


@pytest.fixture
def certificates(tmp_path):
    return make_certificates(tmp_path / "certs")


def tls_broker(own_broker, tmp_path, certificates, certfile: str = "server", **tls):
    """A broker with an amqps listener (and its management API over HTTPS); returns (broker, amqps port)."""
    lines = [f'certfile = "{certificates.path(certfile + ".pem")}"',
             f'keyfile = "{certificates.path(certfile + ".key")}"',
             f'cacertfile = "{certificates.path("ca.pem")}"']
    lines += [f"{key} = {json.dumps(value)}" for key, value in tls.items()]
    config = tmp_path / "warren.toml"
    config.write_text("[tls]\n" + "\n".join(lines) + "\n[management]\ntls = true\n")
    port = free_port()
    return own_broker("--config", str(config), "--tls-port", str(port)), port


def client_context(certificates, trusted: str = "ca.pem", certificate: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=certificates.path(trusted))
    if certificate is not None:
        context.load_cert_chain(certificates.path(certificate + ".pem"), certificates.path(certificate + ".key"))
    return context


def pika_parameters(port: int, context: ssl.SSLContext) -> pika.ConnectionParameters:
    return pika.ConnectionParameters("127.0.0.1", port, credentials=pika.PlainCredentials("guest", "guest"),
                                     ssl_options=pika.SSLOptions(context, "localhost"), connection_attempts=1)


def https_get(broker, path: str, certificates) -> tuple[int, dict]:
    request = urllib.request.Request(f"https://localhost:{broker.management_port}{path}",
                                     headers={"authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})  # guest:guest
    try:
        with urllib.request.urlopen(request, context=client_context(certificates), timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_pika_and_aio_pika_publish_and_consume_over_tls(own_broker, tmp_path, certificates, unique):
    broker, port = tls_broker(own_broker, tmp_path, certificates)
    with pika.BlockingConnection(pika_parameters(port, client_context(certificates))) as conn:
        ch = conn.channel()
        ch.queue_declare(unique)
        ch.basic_publish("", unique, b"over tls")
        status, connections = https_get(broker, "/api/connections", certificates)
        assert status == 200 and [c["ssl"] for c in connections] == [True]

    async def with_aio_pika() -> bytes:
        connection = await aio_pika.connect(host="127.0.0.1", port=port, ssl=True,
                                            ssl_context=client_context(certificates))
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue(unique, passive=True)
            message = await queue.get(no_ack=True)
            return message.body

    assert asyncio.run(with_aio_pika()) == b"over tls"
    with connect(broker) as plain:  # the plain listener serves as before
        assert plain.channel().queue_declare(unique, passive=True).method.message_count == 0
    status, overview = https_get(broker, "/api/overview", certificates)
    assert {(listener["protocol"], listener["port"]) for listener in overview["listeners"]} >= {
        ("amqp/ssl", port), ("https", broker.management_port), ("amqp", broker.port)}
    assert https_get(broker, "/api/health/checks/certificate-expiration/1/months", certificates) == (
        200, {"status": "ok"})


def test_warrenctl_trusts_a_private_ca_it_is_given_and_says_so_when_an_http_url_meets_https(own_broker, tmp_path,
                                                                                            certificates):
    broker, _ = tls_broker(own_broker, tmp_path, certificates)
    wait_for_port(broker.host, broker.management_port, broker.process)

    def warrenctl(url: str, *options: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "warrenctl", *options, "list_vhosts"], cwd=REPO_ROOT,
                              env={**os.environ, "WARREN_MANAGEMENT_URL": url}, capture_output=True, text=True,
                              timeout=60)

    https = f"https://localhost:{broker.management_port}"
    trusted = warrenctl(https, "--cacert", certificates.path("ca.pem"))
    assert (trusted.returncode, trusted.stdout) == (0, "Listing vhosts ...\nname\n/\n"), trusted.stderr
    untrusted = warrenctl(https)
    assert untrusted.returncode == 69 and "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr, untrusted.stderr
    plain = warrenctl(f"http://localhost:{broker.management_port}")
    assert plain.returncode == 69 and "give an https:// URL" in plain.stderr, plain.stderr


def test_a_client_that_does_not_trust_the_servers_ca_fails_its_handshake(own_broker, tmp_path, certificates):
    broker, port = tls_broker(own_broker, tmp_path, certificates)
    with pytest.raises(REFUSED):
        pika.BlockingConnection(pika_parameters(port, client_context(certificates, trusted="other-ca.pem")))
    with pika.BlockingConnection(pika_parameters(port, client_context(certificates))):
        pass  # the next client is served
    assert "Traceback" not in broker.log()


def test_an_expired_certificate_fails_verifying_clients_and_the_expiry_health_check(own_broker, tmp_path,
                                                                                     certificates):
    broker, port = tls_broker(own_broker, tmp_path, certificates, certfile="expired")
    with socket.create_connection(("127.0.0.1", port)) as raw:
        with pytest.raises(ssl.SSLCertVerificationError, match="certificate has expired"):
            client_context(certificates).wrap_socket(raw, server_hostname="localhost")
    request = urllib.request.Request(f"http://127.0.0.1:{broker.management_port}/api/overview")
    with pytest.raises((urllib.error.URLError, http.client.HTTPException, ConnectionError)):  # it speaks HTTPS only
        urllib.request.urlopen(request, timeout=5)
    relaxed = ssl.create_default_context(cafile=certificates.path("ca.pem"))
    relaxed.check_hostname, relaxed.verify_mode = False, ssl.CERT_NONE
    check = urllib.request.Request(
        f"https://127.0.0.1:{broker.management_port}/api/health/checks/certificate-expiration/1/days",
        headers={"authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(check, context=relaxed, timeout=10)
    body = json.loads(refused.value.read())
    assert refused.value.code == 503 and body["status"] == "failed"
    assert [entry["certfile"] for entry in body["expired"]] == [certificates.path("expired.pem")]


def test_client_certificates_are_required_and_checked_with_verify_peer(own_broker, tmp_path, certificates):
    broker, port = tls_broker(own_broker, tmp_path, certificates, verify="verify_peer", fail_if_no_peer_cert=True)
    with pika.BlockingConnection(pika_parameters(port, client_context(certificates, certificate="client"))):
        pass
    for refused in (client_context(certificates), client_context(certificates, certificate="stranger")):
        with pytest.raises(REFUSED):
            pika.BlockingConnection(pika_parameters(port, refused))
    assert "Traceback" not in broker.log()


def test_plain_amqp_on_the_tls_port_gets_no_amqp_answer_and_harms_nobody(own_broker, tmp_path, certificates):
    broker, port = tls_broker(own_broker, tmp_path, certificates)
    with socket.create_connection(("127.0.0.1", port), timeout=15) as raw:
        raw.sendall(b"AMQP\x00\x00\x09\x01")
        answer = b""
        while chunk := raw.recv(4096):  # the broker answers with a TLS alert (or nothing) and hangs up
            answer += chunk
    assert not answer.startswith(b"AMQP") and b"connection.start" not in answer
    with pika.BlockingConnection(pika_parameters(port, client_context(certificates))):
        pass
    assert "Traceback" not in broker.log()


@pytest.mark.parametrize("keys, message", [
    ({"certfile": "missing.pem", "keyfile": "server.key"}, "cannot use TLS certificate"),
    ({"certfile": "server.pem", "keyfile": "client.key"}, "cannot use TLS certificate"),
])
def test_a_certificate_that_cannot_be_used_stops_start_up_with_a_message(tmp_path, certificates, keys, message):
    config = tmp_path / "warren.toml"
    config.write_text("[tls]\n" + "".join(f'{key} = "{certificates.path(name)}"\n' for key, name in keys.items()))
    result = subprocess.run([sys.executable, "-m", "broker", "--config", str(config), "--port", "0",
                             "--tls-port", "0", "--management-port", "0", "--prometheus-port", "0", "--mqtt-port", "0",
                             "--data-dir", str(tmp_path / "data")], cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 1
    assert message in result.stderr and "Traceback" not in result.stderr
