"""Definitions: GET /api/definitions exports RabbitMQ's JSON, POST imports it (users log in with their old
passwords, permissions and policies apply, queues and bindings route), a RabbitMQ 3.10 export imports into Warren
and Warren's back into RabbitMQ; load_definitions and [[users]]/[[vhosts]]/[[permissions]]/[[topic_permissions]] are
applied at start."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pika
import pika.exceptions
import pytest

from tests.conftest import REPO_ROOT, wait_for_port
from tests.integration.helpers import EVENT_TIMEOUT, channel_error, get, wait_for_message_count
from tests.integration.management import quote, request, wait_for_api
from tests.integration.reference import reference_rabbitmq

# AMQP port of the reference RabbitMQ these tests start (its API is on +10000). Both lie below the kernel's
# ephemeral range (32768-60999): probing a free port inside it can connect the probe to itself, and the TIME-WAIT
# that leaves behind makes the node's listener fail with eaddrinuse.
REFERENCE_PORT = 17360


def start_warren(own_broker, *args: str):
    """A Warren of the test's own, once its management API listens too (it starts just after the AMQP port)."""
    warren = own_broker(*args)
    wait_for_port(warren.host, warren.management_port, warren.process)
    return warren


def connect_as(broker, user: str, password: str, vhost: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(
        f"amqp://{quote(user)}:{quote(password)}@{broker.host}:{broker.port}/{quote(vhost)}"))


def definitions(vhost: str, user: str, password: str) -> dict:
    """A vhost with a user who may use only its app.* objects, a DLX policy, and a routed queue."""
    return {
        "vhosts": [{"name": vhost}],
        "users": [{"name": user, "password": password, "tags": "management"}],
        "permissions": [{"user": user, "vhost": vhost, "configure": "^app\\.", "write": ".*", "read": ".*"},
                        {"user": "guest", "vhost": vhost, "configure": ".*", "write": ".*", "read": ".*"}],
        "topic_permissions": [{"user": user, "vhost": vhost, "exchange": "app.in", "write": "^work\\.", "read": ".*"}],
        "policies": [{"vhost": vhost, "name": "dlx", "pattern": "^app\\.work$", "apply-to": "queues",
                      "definition": {"dead-letter-exchange": "app.dead"}, "priority": 1}],
        "exchanges": [{"name": "app.in", "vhost": vhost, "type": "topic", "durable": True, "auto_delete": False,
                       "internal": False, "arguments": {}},
                      {"name": "app.dead", "vhost": vhost, "type": "fanout", "durable": True,
                       "auto_delete": False, "internal": False, "arguments": {}}],
        "queues": [{"name": "app.work", "vhost": vhost, "durable": True, "auto_delete": False, "arguments": {}},
                   {"name": "app.dead-letters", "vhost": vhost, "durable": True, "auto_delete": False,
                    "arguments": {}}],
        "bindings": [{"source": "app.in", "vhost": vhost, "destination": "app.work", "destination_type": "queue",
                      "routing_key": "work.#", "arguments": {}},
                     {"source": "app.dead", "vhost": vhost, "destination": "app.dead-letters",
                      "destination_type": "queue", "routing_key": "", "arguments": {}}],
    }


def check_definitions_apply(broker, vhost: str, user: str, password: str) -> None:
    """What a user of the imported definitions observes: the login, the permissions and topic permissions, the
    routing, the policy."""
    with connect_as(broker, user, password, vhost) as conn:
        ch = conn.channel()
        code, text = channel_error(lambda: ch.queue_declare("other", durable=True))
        assert (code, text) == (403, f"ACCESS_REFUSED - access to queue 'other' in vhost '{vhost}' refused for "
                                     f"user '{user}'")
        ch = conn.channel()
        code, text = channel_error(lambda: ch.basic_publish("app.in", "other.1", b"refused"), ch)
        assert code == 403  # (the text names the vhost and the user after this, cut at 255 bytes where they are long)
        assert text.startswith(f"ACCESS_REFUSED - access to topic 'other.1' in exchange 'app.in' in vhost '{vhost}'")
        ch = conn.channel()
        ch.basic_publish("app.in", "work.1", b"routed")
        wait_for_message_count(ch, "app.work", 1)
        method, _, body = ch.basic_get("app.work")
        assert body == b"routed"
        ch.basic_reject(method.delivery_tag, requeue=False)  # dead-lettered through the policy's exchange
        wait_for_message_count(ch, "app.dead-letters", 1)
        assert get(ch, "app.dead-letters").body == b"routed"


@pytest.fixture
def cleanup(broker):
    """Vhosts and users a test made on the shared broker, deleted at its end."""
    made: list[tuple[str, str]] = []
    yield made
    for kind, name in made:
        request(broker, "DELETE", f"/api/{kind}/{quote(name)}")


# --- against Warren and the reference alike -------------------------------------------------------------------------
def test_imported_definitions_apply_and_are_exported_in_rabbitmqs_shape(broker, unique, cleanup):
    vhost, user = f"{unique}-vh", f"{unique}-user"
    cleanup += [("vhosts", vhost), ("users", user)]
    assert request(broker, "POST", "/api/definitions", definitions(vhost, user, "p4ss")).status == 204
    check_definitions_apply(broker, vhost, user, "p4ss")
    exported = request(broker, "GET", "/api/definitions").body
    for key in ("rabbit_version", "rabbitmq_version", "product_name", "product_version", "users", "vhosts",
                "permissions", "topic_permissions", "parameters", "global_parameters", "policies", "queues",
                "exchanges", "bindings"):
        assert key in exported
    [exported_user] = [item for item in exported["users"] if item["name"] == user]
    assert exported_user["tags"] == ["management"]
    assert exported_user["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    assert {"name": "app.work", "vhost": vhost, "durable": True, "auto_delete": False,
            "arguments": {}} in exported["queues"]
    assert {"source": "app.in", "vhost": vhost, "destination": "app.work", "destination_type": "queue",
            "routing_key": "work.#", "arguments": {}} in exported["bindings"]
    assert {"vhost": vhost, "name": "dlx", "pattern": "^app\\.work$", "apply-to": "queues",
            "definition": {"dead-letter-exchange": "app.dead"}, "priority": 1} in exported["policies"]
    assert {"user": user, "vhost": vhost, "exchange": "app.in", "write": "^work\\.",
            "read": ".*"} in exported["topic_permissions"]
    one = request(broker, "GET", f"/api/definitions/{quote(vhost)}").body
    assert set(one) == {"rabbit_version", "parameters", "policies", "queues", "exchanges", "bindings"}
    assert {"name": "app.work", "durable": True, "auto_delete": False, "arguments": {}} in one["queues"]


def test_a_vhost_import_puts_everything_in_that_vhost(broker, unique, cleanup):
    source, target = f"{unique}-a", f"{unique}-b"
    cleanup += [("vhosts", source), ("vhosts", target)]
    assert request(broker, "POST", "/api/definitions", {
        "vhosts": [{"name": source}, {"name": target}],
        "permissions": [{"user": "guest", "vhost": name, "configure": ".*", "write": ".*", "read": ".*"}
                        for name in (source, target)],
        "queues": [{"name": "kept", "vhost": source, "durable": True, "auto_delete": False, "arguments": {}}],
    }).status == 204
    exported = request(broker, "GET", f"/api/definitions/{quote(source)}").body
    assert request(broker, "POST", f"/api/definitions/{quote(target)}", exported).status == 204
    assert request(broker, "GET", f"/api/queues/{quote(target)}/kept").status == 200


def test_a_bad_import_is_a_400(broker, unique):
    reply = request(broker, "POST", "/api/definitions", {
        "queues": [{"name": "q", "vhost": f"{unique}-none", "durable": True, "auto_delete": False,
                    "arguments": {}}]})
    assert (reply.status, reply.body["error"]) == (400, "bad_request")
    reply = request(broker, "POST", "/api/definitions", raw_body=b'{"users": [')
    assert (reply.status, reply.body["error"]) == (400, "bad_request")


def test_only_administrators_export_and_import(broker, unique, cleanup):
    user = f"{unique}-monitor"
    cleanup.append(("users", user))
    assert request(broker, "PUT", f"/api/users/{quote(user)}", {"password": "pw", "tags": "monitoring"}).status == 201
    for method, path in (("GET", "/api/definitions"), ("POST", "/api/definitions"),
                         ("GET", "/api/definitions/%2F")):
        reply = request(broker, method, path, {} if method == "POST" else None, user=user, password="pw")
        assert (reply.status, reply.body) == (401, {"error": "not_authorised", "reason": "Not administrator user"})


# --- Warren only ---------------------------------------------------------------------------------------------------
def test_a_document_nested_too_deeply_is_a_400_without_a_traceback(own_broker):
    broker = own_broker()
    reply = request(broker, "POST", "/api/definitions", raw_body=b"[" * 100_000 + b"]" * 100_000)
    assert (reply.status, reply.body) == (400, {"error": "bad_request",
                                                "reason": "failed to decode JSON: nested too deeply"})
    assert "Traceback" not in broker.log()


def test_an_import_is_all_or_nothing_and_names_the_bad_item(own_broker):
    warren = start_warren(own_broker)
    document = definitions("shop", "clerk", "pw")
    document["queues"].append({"name": "bad", "vhost": "shop", "arguments": {"x-max-length": "ten"}})
    reply = request(warren, "POST", "/api/definitions", document)
    assert reply.status == 400
    assert reply.body["reason"].startswith("queue 'bad' in vhost 'shop': PRECONDITION_FAILED - invalid arg "
                                           "'x-max-length' for queue 'bad' in vhost 'shop'")
    assert [vhost["name"] for vhost in request(warren, "GET", "/api/vhosts").body] == ["/"]
    assert [user["name"] for user in request(warren, "GET", "/api/users").body] == ["guest"]


def test_imported_definitions_survive_a_restart(own_broker):
    warren = start_warren(own_broker)
    assert request(warren, "POST", "/api/definitions", definitions("shop", "clerk", "pw")).status == 204
    warren.restart()
    wait_for_port(warren.host, warren.management_port, warren.process)
    check_definitions_apply(warren, "shop", "clerk", "pw")


def test_a_form_upload_is_refused_and_a_download_names_its_file(own_broker):
    """RabbitMQ's UI uploads definitions as a form; Warren takes them as a JSON body only (its console sends that),
    so that no page of another site can import definitions with the browser's credentials (docs/security.md)."""
    warren = start_warren(own_broker)
    boundary = "warren-test-boundary"
    form = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"d.json\"\r\n"
            f"Content-Type: application/json\r\n\r\n{json.dumps({'vhosts': [{'name': 'uploaded'}]})}\r\n"
            f"--{boundary}--\r\n").encode()
    upload = request(warren, "POST", "/api/definitions", raw_body=form,
                     headers={"content-type": f"multipart/form-data; boundary={boundary}"})
    assert upload.status == 415 and upload.body["error"] == "unsupported_media_type"
    assert request(warren, "GET", "/api/vhosts/uploaded").status == 404
    assert request(warren, "POST", "/api/definitions", {"vhosts": [{"name": "uploaded"}]}).status == 204
    download = urllib.request.Request(warren.management_url + "/api/definitions?download=warren.json",
                                      headers={"authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(download, timeout=EVENT_TIMEOUT) as reply:
        assert reply.headers["Content-Disposition"] == "attachment; filename=warren.json"
        assert "uploaded" in {vhost["name"] for vhost in json.loads(reply.read())["vhosts"]}


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "warren.toml"
    path.write_text(text)
    return path


BOOT_CONFIG = """
[server]
load_definitions = "{definitions}"
[[users]]
name = "ops"
password = "ops-pass"
tags = ["administrator"]
[[permissions]]
user = "ops"
vhost = "shop"
configure = ".*"
write = ".*"
read = ".*"
[[topic_permissions]]
user = "ops"
vhost = "shop"
exchange = "app.in"
write = "^ops\\\\."
read = ".*"
"""


def test_boot_definitions_replace_the_default_user_and_apply_at_every_start(own_broker, tmp_path):
    definitions_file = tmp_path / "definitions.json"
    document = definitions("shop", "clerk", "pw")
    document["permissions"].pop()  # guest's: there is no guest, as the boot definitions define users
    definitions_file.write_text(json.dumps(document))
    config = write_config(tmp_path, BOOT_CONFIG.format(definitions=definitions_file))
    warren = start_warren(own_broker, "--config", str(config))
    check_definitions_apply(warren, "shop", "clerk", "pw")
    users = {user["name"] for user in request(warren, "GET", "/api/users", user="ops", password="ops-pass").body}
    assert users == {"clerk", "ops"}  # no guest: the boot definitions define users
    assert request(warren, "GET", "/api/vhosts/%2F", user="ops", password="ops-pass").status == 200
    assert request(warren, "GET", "/api/topic-permissions/shop/ops", user="ops", password="ops-pass").body == [
        {"user": "ops", "vhost": "shop", "exchange": "app.in", "write": "^ops\\.", "read": ".*"}]
    # changed through the API, then restored by the next start
    assert request(warren, "PUT", "/api/users/clerk", {"password": "changed", "tags": ""},
                   user="ops", password="ops-pass").status == 204
    warren.restart()
    wait_for_port(warren.host, warren.management_port, warren.process)
    check_definitions_apply(warren, "shop", "clerk", "pw")


def run_server(tmp_path: Path, config: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "broker", "--config", str(config), "--data-dir",
                           str(tmp_path / "data"), "--port", "0", "--management-port", "0", "--prometheus-port", "0", "--mqtt-port", "0"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("content, code, message", [
    ("{broken", 2, "warren-server: load_definitions file {path} is not valid JSON: "),
    (json.dumps({"permissions": [{"user": "nobody", "vhost": "/", "configure": ".*", "write": ".*",
                                  "read": ".*"}]}),
     1, "warren-server: cannot apply the definitions of load_definitions file {path}: permission of user 'nobody' "
        "in vhost '/': no user 'nobody'"),
    (json.dumps({"policies": [{"vhost": "/", "name": "p", "pattern": "^q", "definition": {"bogus": 1}}]}),
     1, "warren-server: cannot apply the definitions of load_definitions file {path}: policy 'p' in vhost '/': "
        "Validation failed"),
])
def test_a_bad_definitions_file_stops_the_start_with_one_line(tmp_path, content, code, message):
    if os.environ.get("WARREN_TEST_URL"):
        pytest.skip("starts a broker process of its own")
    path = tmp_path / "definitions.json"
    path.write_text(content)
    result = run_server(tmp_path, write_config(tmp_path, f'[server]\nload_definitions = "{path}"\n'))
    assert result.returncode == code
    assert result.stderr.splitlines()[-1].startswith(message.format(path=path))  # after the log, if any
    assert "Traceback" not in result.stderr


# --- a round trip with the reference RabbitMQ -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reference():
    with reference_rabbitmq(REFERENCE_PORT) as node:
        yield node


def test_a_rabbitmq_export_imports_into_warren_and_warrens_back_into_rabbitmq(reference, own_broker):
    wait_for_api(reference)
    vhost, user = "roundtrip", "rt-user"
    request(reference, "DELETE", f"/api/vhosts/{vhost}")
    # the user made through RabbitMQ's API, so that its export carries a hash RabbitMQ made
    assert request(reference, "PUT", f"/api/users/{user}", {"password": "rt-pass", "tags": "management"}
                   ).status in (201, 204)
    assert request(reference, "POST", "/api/definitions", {**definitions(vhost, user, "rt-pass"), "users": []}
                   ).status == 204
    exported = request(reference, "GET", "/api/definitions").body
    [rabbit_user] = [item for item in exported["users"] if item["name"] == user]

    warren = start_warren(own_broker)
    assert request(warren, "POST", "/api/definitions", exported).status == 204
    check_definitions_apply(warren, vhost, user, "rt-pass")
    [warren_user] = [item for item in request(warren, "GET", "/api/definitions").body["users"]
                     if item["name"] == user]
    assert warren_user["password_hash"] == rabbit_user["password_hash"]

    back = request(warren, "GET", "/api/definitions").body
    assert request(reference, "DELETE", f"/api/vhosts/{vhost}").status == 204
    assert request(reference, "DELETE", f"/api/users/{user}").status == 204
    assert request(reference, "POST", "/api/definitions", back).status == 204
    check_definitions_apply(reference, vhost, user, "rt-pass")


@pytest.mark.alone
def test_a_big_import_lets_other_clients_go_on(own_broker):
    """30,000 queues, imported in slices: an AMQP client's round trips stay quick meanwhile (in one piece, such an
    import held the event loop for seconds)."""
    warren = start_warren(own_broker)
    queues = [{"name": f"imported-{number}", "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}}
              for number in range(30_000)]
    replies = []
    importer = threading.Thread(target=lambda: replies.append(
        request(warren, "POST", "/api/definitions", {"queues": queues}, timeout=120)))
    with pika.BlockingConnection(pika.URLParameters(warren.url)) as connection:
        channel = connection.channel()
        channel.queue_declare("measuring", exclusive=True)
        importer.start()
        round_trips = []
        while importer.is_alive():
            started = time.monotonic()
            channel.queue_declare("measuring", passive=True)
            round_trips.append(time.monotonic() - started)
        importer.join()
    assert replies[0].status == 204
    assert request(warren, "GET", "/api/queues/%2F/imported-29999").status == 200
    assert max(round_trips) < 0.1, f"slowest of {len(round_trips)} round trips: {max(round_trips) * 1000:.0f} ms"
