"""rabbitmqadmin, the management API's command-line client shipped with RabbitMQ, works unchanged against the broker:
list, declare, delete, publish, get, purge, export, import and close."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.parse

import pika
import pytest

from tests.conftest import WORKERS
from tests.integration.helpers import connection_error, wait_until
from tests.integration.management import add_vhost, delete_vhost

RABBITMQADMIN = shutil.which("rabbitmqadmin")
pytestmark = pytest.mark.skipif(RABBITMQADMIN is None,
                                reason="rabbitmqadmin is not installed (Debian's rabbitmq-server package ships it)")


def admin(broker, *args: str, vhost: str | None = "/", check: bool = True) -> subprocess.CompletedProcess:
    """Run rabbitmqadmin against the broker's management API as guest, in vhost (None: the whole broker, for
    export and import)."""
    url = urllib.parse.urlparse(broker.management_url)
    command = [sys.executable, RABBITMQADMIN, "-H", url.hostname, "-P", str(url.port), "-u", "guest", "-p", "guest",
               *(("-V", vhost) if vhost is not None else ()), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    if check:
        assert done.returncode == 0, done
    return done


def listing(broker, what: str, vhost: str = "/") -> list[dict]:
    """rabbitmqadmin's list of what, as the JSON it prints with -f raw_json."""
    return json.loads(admin(broker, "-f", "raw_json", "list", what, vhost=vhost).stdout or "[]")


@pytest.fixture
def vhost(broker, unique):
    """A vhost of the test's own, so that listings show only what the test made."""
    add_vhost(broker, unique)
    yield unique
    delete_vhost(broker, unique)


def test_declare_list_and_delete_queues_exchanges_and_bindings(broker, vhost):
    assert "queue declared" in admin(broker, "declare", "queue", "name=jobs", "durable=true", vhost=vhost).stdout
    admin(broker, "declare", "exchange", "name=work", "type=topic", vhost=vhost)
    admin(broker, "declare", "binding", "source=work", "destination=jobs", "routing_key=job.*", vhost=vhost)

    queues = listing(broker, "queues", vhost)
    assert [(q["name"], q["durable"]) for q in queues] == [("jobs", True)]
    assert ("work", "topic") in [(e["name"], e["type"]) for e in listing(broker, "exchanges", vhost)]
    assert ("work", "jobs", "job.*") in [(b["source"], b["destination"], b["routing_key"])
                                         for b in listing(broker, "bindings", vhost)]

    admin(broker, "delete", "binding", "source=work", "destination=jobs", "destination_type=queue",
          "properties_key=job.*", vhost=vhost)
    assert "work" not in [b["source"] for b in listing(broker, "bindings", vhost)]
    admin(broker, "delete", "exchange", "name=work", vhost=vhost)
    admin(broker, "delete", "queue", "name=jobs", vhost=vhost)
    assert listing(broker, "queues", vhost) == []
    assert "work" not in [e["name"] for e in listing(broker, "exchanges", vhost)]


def test_publish_get_and_purge(broker, vhost):
    admin(broker, "declare", "queue", "name=inbox", "durable=false", vhost=vhost)
    for body in ("first", "second", "third"):
        published = admin(broker, "publish", "exchange=amq.default", "routing_key=inbox", f"payload={body}",
                          vhost=vhost)
        assert "Message published" in published.stdout

    got = json.loads(admin(broker, "-f", "raw_json", "get", "queue=inbox", "ackmode=ack_requeue_false",
                           vhost=vhost).stdout)
    assert [(m["payload"], m["message_count"], m["routing_key"]) for m in got] == [("first", 2, "inbox")]
    peeked = json.loads(admin(broker, "-f", "raw_json", "get", "queue=inbox", "count=2", vhost=vhost).stdout)
    assert [m["payload"] for m in peeked] == ["second", "third"]  # ack_requeue_true by default: they stay

    assert "queue purged" in admin(broker, "purge", "queue", "name=inbox", vhost=vhost).stdout
    assert json.loads(admin(broker, "-f", "raw_json", "get", "queue=inbox", vhost=vhost).stdout or "[]") == []


def test_users_vhosts_permissions_and_policies(broker, unique):
    admin(broker, "declare", "vhost", f"name={unique}")
    admin(broker, "declare", "user", f"name={unique}", "password=pw", "tags=monitoring")
    admin(broker, "declare", "permission", f"vhost={unique}", f"user={unique}", "configure=^c", "write=^w",
          "read=.*")
    admin(broker, "declare", "policy", "name=cap", "pattern=^q", 'definition={"max-length": 3}',
          "apply-to=queues", vhost=unique)
    try:
        assert unique in [v["name"] for v in listing(broker, "vhosts")]
        assert [u["tags"] for u in listing(broker, "users") if u["name"] == unique] == [["monitoring"]]
        assert {"vhost": unique, "user": unique, "configure": "^c", "write": "^w", "read": ".*"} in \
            listing(broker, "permissions")
        policies = [(p["name"], p["pattern"], p["definition"], p["apply-to"]) for p in listing(broker, "policies")
                    if p["vhost"] == unique]
        assert policies == [("cap", "^q", {"max-length": 3}, "queues")]
        with pika.BlockingConnection(pika.ConnectionParameters(
                broker.host, broker.port, unique, pika.PlainCredentials(unique, "pw"))) as conn:
            assert conn.is_open
    finally:
        admin(broker, "delete", "policy", "name=cap", vhost=unique)
        admin(broker, "delete", "permission", f"vhost={unique}", f"user={unique}")
        admin(broker, "delete", "user", f"name={unique}")
        admin(broker, "delete", "vhost", f"name={unique}")
    assert unique not in [u["name"] for u in listing(broker, "users")]
    assert unique not in [v["name"] for v in listing(broker, "vhosts")]


def test_export_and_import_definitions(broker, vhost, tmp_path):
    admin(broker, "declare", "queue", "name=kept", "durable=true", vhost=vhost)
    admin(broker, "declare", "exchange", "name=kept-x", "type=fanout", vhost=vhost)
    admin(broker, "declare", "binding", "source=kept-x", "destination=kept", vhost=vhost)
    exported = tmp_path / "definitions.json"
    assert "Exported definitions" in admin(broker, "export", str(exported), vhost=None).stdout
    definitions = json.loads(exported.read_text())
    assert {"name": vhost} in [{"name": v["name"]} for v in definitions["vhosts"]]
    assert ("kept", vhost) in [(q["name"], q["vhost"]) for q in definitions["queues"]]

    admin(broker, "delete", "exchange", "name=kept-x", vhost=vhost)
    admin(broker, "delete", "queue", "name=kept", vhost=vhost)
    assert "Uploaded definitions" in admin(broker, "import", str(exported), vhost=None).stdout
    assert [q["name"] for q in listing(broker, "queues", vhost)] == ["kept"]
    assert ("kept-x", "kept") in [(b["source"], b["destination"]) for b in listing(broker, "bindings", vhost)]


def test_list_nodes_and_show_overview(broker):
    nodes = listing(broker, "nodes")
    assert len(nodes) == (1 if broker.external else WORKERS) and nodes[0]["running"] is True  # one per worker
    overview = json.loads(admin(broker, "-f", "raw_json", "show", "overview").stdout)
    assert overview[0]["rabbitmq_version"] and overview[0]["cluster_name"]


def test_list_and_close_connections(broker, unique):
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        broker.host, broker.port, client_properties={"connection_name": unique}))
    conn.channel()

    def listed() -> str | None:
        """The connection's name once it and its channel are listed."""
        mine = [c["name"] for c in listing(broker, "connections") if c.get("user_provided_name") == unique]
        channels = [c["connection_details"]["name"] for c in listing(broker, "channels")]
        return mine[0] if mine and mine[0] in channels else None
    # RabbitMQ lists connections and channels after its next statistics emission
    name = wait_until(conn, listed, 30, "the connection and its channel listed")
    code, text = connection_error(lambda: admin(broker, "close", "connection", f"name={name}"), conn)
    assert (code, text) == (320, "CONNECTION_FORCED - Closed via management plugin")


def test_an_unknown_object_is_reported_not_found(broker, unique):
    done = admin(broker, "delete", "queue", f"name={unique}", check=False)
    assert done.returncode != 0
    assert "Not found" in done.stdout + done.stderr
