"""MQTT over TLS (the [tls] certificate on [mqtt] tls_port) and over WebSockets ([mqtt] web_port), beside plain MQTT
on the same broker."""

from __future__ import annotations

import ssl

import pytest

from tests.conftest import free_port
from tests.integration.management import request
from tests.mqtt.clients import Client, connected
from tests.tls_certs import make_certificates
from tests.waiting import wait_for


@pytest.fixture
def tls_broker(own_broker, tmp_path):
    """A broker with MQTT over TLS: (broker, its MQTT over TLS port, a client context trusting its CA)."""
    certificates = make_certificates(tmp_path / "certs")
    config = tmp_path / "warren.toml"
    port = free_port()
    config.write_text(f'[tls]\ncertfile = "{certificates.path("server.pem")}"\n'
                      f'keyfile = "{certificates.path("server.key")}"\n[mqtt]\ntls_port = {port}\n')
    return own_broker("--config", str(config)), port, ssl.create_default_context(cafile=certificates.path("ca.pem"))


def test_mqtt_over_tls_meets_plain_mqtt(tls_broker, unique):
    broker, port, context = tls_broker
    with connected(broker, f"{unique}-s", port=port, tls=context) as secure, \
            connected(broker, f"{unique}-p") as plain:
        secure.subscribe(f"{unique}/a", qos=1)
        plain.publish(f"{unique}/a", b"to the TLS client", qos=1)
        assert secure.receive().payload == b"to the TLS client"
        secure.publish(f"{unique}/a", b"from it", qos=1)
        assert secure.receive().payload == b"from it"


def test_a_client_that_does_not_trust_the_certificate_is_refused(tls_broker, unique):
    broker, port, _ = tls_broker
    client = Client(broker, unique, port=port, tls=ssl.create_default_context())
    with pytest.raises(ssl.SSLError):
        client.paho.connect("localhost", port)


def test_mqtt_over_websockets_meets_plain_mqtt(own_broker, tmp_path, unique):
    port = free_port()
    broker = own_broker("--config", str(_config(tmp_path, f"[mqtt]\nweb_port = {port}\n")))
    with connected(broker, f"{unique}-s", port=port, transport="websockets") as browser, \
            connected(broker, f"{unique}-p") as plain:
        browser.subscribe(f"{unique}/a", qos=1)
        plain.publish(f"{unique}/a", b"to the browser", qos=1)
        assert browser.receive().payload == b"to the browser"
        browser.publish(f"{unique}/a", b"from it", qos=1, retain=True)
        assert browser.receive().payload == b"from it"
        assert protocols(broker, unique, 2) == {f"{unique}-s": "Web MQTT 3.1.1", f"{unique}-p": "MQTT 3.1.1"}
    with connected(broker, f"{unique}-s2", port=port, transport="websockets", version=5) as again:
        again.subscribe(f"{unique}/a", qos=1)
        message = again.receive()
        assert (message.payload, message.retain) == (b"from it", True)
        assert protocols(broker, unique, 1) == {f"{unique}-s2": "Web MQTT 5.0"}


def test_a_websocket_client_reaches_the_worker_that_serves_its_vhost(own_broker, tmp_path, unique):
    """With workers, whichever worker takes a WebSocket sends its MQTT stream to the worker of the client's vhost
    (two vhosts, one pinned to each of two workers), where plain MQTT clients of that vhost meet it."""
    port = free_port()
    vhosts = ("zero", "one")
    config = f"[mqtt]\nweb_port = {port}\n" + "".join(
        f'[[vhosts]]\nname = "{vhost}"\nworker = {number}\n[[permissions]]\nuser = "guest"\nvhost = "{vhost}"\n'
        f'configure = ".*"\nwrite = ".*"\nread = ".*"\n' for number, vhost in enumerate(vhosts))
    broker = own_broker("--workers", "2", "--config", str(_config(tmp_path, config)))
    for vhost in vhosts:
        login = {"username": f"{vhost}:guest", "password": "guest"}
        with connected(broker, f"{unique}-{vhost}-s", port=port, transport="websockets", **login) as browser, \
                connected(broker, f"{unique}-{vhost}-p", **login) as plain:
            browser.subscribe(f"{unique}/a", qos=1)
            plain.publish(f"{unique}/a", f"to the browser in {vhost}".encode(), qos=1)
            assert browser.receive().payload == f"to the browser in {vhost}".encode()
            browser.publish(f"{unique}/a", b"from it", qos=1)
            assert browser.receive().payload == b"from it"
            browser.nothing_more()  # (nothing of the other vhost's)
            assert protocols(broker, unique, 2) == {f"{unique}-{vhost}-s": "Web MQTT 3.1.1",
                                                    f"{unique}-{vhost}-p": "MQTT 3.1.1"}


def protocols(broker, unique: str, count: int) -> dict[str, str]:
    """The protocol the management API shows for each of the test's MQTT clients (by client id), once it lists
    ``count`` of them: "Web MQTT 3.1.1" for one over a WebSocket, as RabbitMQ's web_mqtt names it."""
    listed = wait_for(lambda: [connection for connection in request(broker, "GET", "/api/connections").body
                               if connection["client_properties"].get("client_id", "").startswith(unique)],
                      what=f"{count} MQTT connections listed", until=lambda found: len(found) == count)
    return {connection["client_properties"]["client_id"]: connection["protocol"] for connection in listed}


def _config(tmp_path, text: str):
    path = tmp_path / "warren.toml"
    path.write_text(text)
    return path
