"""What an operator reads in the log: who connected and as whom, why a channel or a connection closed, who changed
policies and definitions; the JSON format for log shippers; the version."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from importlib import metadata

import pika
import pika.exceptions
import pytest

from tests.conftest import REPO_ROOT, WORKER_OPTIONS
from tests.integration.helpers import EVENT_TIMEOUT, connect
from tests.integration.management import clear_policy, quote, request, set_policy
from tests.waiting import wait_for


def logged(broker, text: str, timeout: float = EVENT_TIMEOUT) -> str:
    """The first line of the broker's log that contains text, once it is written (by another process: nothing to
    await but the file's contents)."""
    def lines(log: str) -> list[str]:
        return [line for line in log.splitlines() if text in line]
    return lines(wait_for(broker.log, timeout, f"a log line with {text!r}", until=lines))[0]


def test_a_connection_is_logged_when_accepted_authenticated_and_closed_with_its_reason(own_broker, unique):
    broker = own_broker()
    parameters = pika.URLParameters(broker.url)
    parameters.client_properties = {"connection_name": "billing"}
    with pika.BlockingConnection(parameters) as conn:
        client = conn._impl._transport._sock.getsockname()
        name = f"127.0.0.1:{client[1]} -> 127.0.0.1:{broker.port}"
        with pytest.raises(pika.exceptions.ChannelClosedByBroker):
            conn.channel().queue_declare(unique, passive=True)
    assert logged(broker, f"accepting AMQP connection {name}")
    assert logged(broker, f"connection {name}: user 'guest' authenticated and granted access to vhost '/' "
                          "(client-provided name: 'billing')")
    assert logged(broker, f"channel error on connection {name} (vhost '/', user 'guest'), channel 1: 404 "
                          f"NOT_FOUND - no queue '{unique}' in vhost '/'")
    assert logged(broker, f"closing AMQP connection {name} (vhost '/', user 'guest'): the client closed it (200 "
                          "'Normal shutdown')")


def test_a_connection_the_broker_closes_and_one_the_client_drops_are_logged_as_warnings(own_broker):
    broker = own_broker()
    conn = connect(broker)
    port = conn._impl._transport._sock.getsockname()[1]
    request(broker, "DELETE", "/api/connections/" + quote(f"127.0.0.1:{port} -> 127.0.0.1:{broker.port}"))
    line = logged(broker, f"127.0.0.1:{port} -> 127.0.0.1:{broker.port} (vhost '/', user 'guest'): 320")
    assert " WARNING " in line and "Closed via management plugin" in line
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker):
        conn.process_data_events(time_limit=EVENT_TIMEOUT)

    dropped = connect(broker)
    port = dropped._impl._transport._sock.getsockname()[1]
    dropped._impl._transport._sock.shutdown(socket.SHUT_RDWR)
    line = logged(broker, f"closing AMQP connection 127.0.0.1:{port} -> 127.0.0.1:{broker.port} (vhost '/', user "
                          "'guest'): client unexpectedly closed TCP connection")
    assert " WARNING " in line


def test_a_port_probe_leaves_no_line(own_broker):
    broker = own_broker()
    with socket.create_connection((broker.host, broker.port)) as probe:
        port = probe.getsockname()[1]
    with connect(broker):  # a connection after the probe: once its line is written, the probe's would be too
        pass
    logged(broker, "the client closed it")
    assert f":{port} " not in broker.log()


def test_policy_user_and_definition_changes_are_logged(own_broker, unique):
    broker = own_broker()
    set_policy(broker, "/", unique, "^lim", {"max-length": 5}, priority=3, apply_to="queues")
    assert logged(broker, f"policy '{unique}' set in vhost '/': pattern '^lim', apply-to queues, priority 3, "
                          'definition {"max-length": 5}')
    clear_policy(broker, "/", unique)
    assert logged(broker, f"policy '{unique}' cleared in vhost '/'")
    reply = request(broker, "POST", "/api/definitions", {
        "users": [{"name": "ops", "password": "s3cret", "tags": "monitoring"}],
        "vhosts": [{"name": "staging"}],
        "permissions": [{"user": "ops", "vhost": "staging", "configure": "", "write": "", "read": ".*"}],
        "queues": [{"name": "inbox", "vhost": "staging", "durable": True, "auto_delete": False, "arguments": {}}]})
    assert reply.status in (200, 201, 204), reply
    assert logged(broker, "user 'ops' added (tags: monitoring)")
    assert logged(broker, "vhost 'staging' added")
    assert logged(broker, "permissions of user 'ops' in vhost 'staging' set: configure '', write '', read '.*'")
    assert logged(broker, "definitions imported: 1 vhosts, 1 users, 1 permissions, 0 topic permissions, 0 policies, "
                          "1 queues, 0 exchanges, 0 bindings")


def test_the_json_format_writes_one_object_per_line(own_broker):
    broker = own_broker("--log-format", "json")
    with connect(broker):
        pass
    logged(broker, "the client closed it")
    entries = [json.loads(line) for line in broker.log().splitlines()]
    assert all(set(entry) >= {"time", "level", "logger", "message"} for entry in entries)
    listening = next(entry for entry in entries if "listening on" in entry["message"])
    # (a node of workers listens in its supervisor, whose workers are front doors on its socket)
    assert listening["level"] == "info" and listening["logger"] == (
        "broker.workers.supervisor" if WORKER_OPTIONS else "broker.connection.server")
    assert listening["time"].endswith("+00:00")
    assert any(entry["message"].startswith("accepting AMQP connection") for entry in entries)


def test_the_version_is_printed_and_a_bad_log_format_is_refused(tmp_path):
    shown = subprocess.run([sys.executable, "-m", "broker", "--version"], cwd=REPO_ROOT, capture_output=True,
                           text=True, timeout=30)
    assert (shown.returncode, shown.stdout.strip()) == (0, f"warren-server {metadata.version('warren')}")
    config = tmp_path / "warren.toml"
    config.write_text('[server]\nlog_format = "xml"\n')
    refused = subprocess.run([sys.executable, "-m", "broker", "--config", str(config)], cwd=REPO_ROOT,
                             capture_output=True, text=True, timeout=30)
    assert refused.returncode == 2
    assert "log_format must be one of text, json, got 'xml'" in refused.stderr


def test_a_broker_whose_event_loop_is_held_says_for_how_long(own_broker):
    """Every client waits while a broker's event loop is held: a hold of more than a quarter of a second is logged
    with how long it lasted (here the whole process is stopped for 0.6 s, its watching thread too, so the line
    cannot say where the loop was)."""
    broker = own_broker()
    broker.process.send_signal(signal.SIGSTOP)
    try:
        time.sleep(0.6)  # (the hold itself)
    finally:
        broker.process.send_signal(signal.SIGCONT)
    line = logged(broker, "the event loop was held for at least")
    assert "WARNING broker.stalls:" in line, line
    assert float(line.split("held for at least ")[1].split(" s")[0]) >= 0.5, line
