"""warrenctl end to end: the real console script (python -m warrenctl) against the broker's management API.

The same tests pass against a reference RabbitMQ's API (rabbitmqctl's output formats and exit codes are
warrenctl's). RabbitMQ's API shows message counts, connections and consumers from statistics emitted every few
seconds, so those checks poll the command until the expected line shows, with a generous bound.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pika
import pika.exceptions
import pytest

from tests.conftest import REPO_ROOT, WORKERS
from tests.integration.helpers import (connection_error, declare_queue, publish, wait_for_message_count,
                                      wait_until)
from tests.integration.management import request
from tests.waiting import wait_for

# RabbitMQ's statistics interval is 5 s: listings of counts, connections and consumers may lag that long.
STATS_TIMEOUT = 15.0


def ctl(broker, *argv: str, stdin: str | None = None, password: str = "guest") -> subprocess.CompletedProcess:
    """Run warrenctl against broker's management API and return its exit code, stdout and stderr."""
    env = {**os.environ, "WARREN_MANAGEMENT_URL": broker.management_url, "WARREN_MANAGEMENT_USER": "guest",
           "WARREN_MANAGEMENT_PASSWORD": password}
    return subprocess.run([sys.executable, "-m", "warrenctl", *argv], cwd=REPO_ROOT, env=env, input=stdin,
                          capture_output=True, text=True, timeout=60)


def ok(broker, *argv: str, stdin: str | None = None) -> str:
    """Run warrenctl, check it succeeded without complaint, and return its stdout."""
    done = ctl(broker, *argv, stdin=stdin)
    assert (done.returncode, done.stderr) == (0, ""), done
    return done.stdout


def failed(broker, *argv: str) -> tuple[int, str]:
    """Run warrenctl, which must fail with one error line, and return its exit code and that line."""
    done = ctl(broker, *argv)
    assert done.returncode != 0 and done.stderr.startswith("Error: "), done
    assert "Traceback" not in done.stderr
    return done.returncode, done.stderr.splitlines()[0]


def queue_exists(conn, name: str) -> bool:
    channel = conn.channel()
    try:
        channel.queue_declare(name, passive=True)
    except pika.exceptions.ChannelClosedByBroker:
        return False
    channel.close()
    return True


def test_list_queues_prints_rabbitmqctls_banner_header_and_rows(broker, conn, unique):
    channel = conn.channel()
    queue = declare_queue(channel, unique, arguments={"x-max-length": 5})
    publish(channel, queue, [b"a", b"b"])
    out = wait_for(lambda: ok(broker, "list_queues"), STATS_TIMEOUT, f"{queue} listed with 2 messages", 0.2,
                   until=lambda out: f"\n{queue}\t2\n" in out)
    assert out.startswith("Listing queues for vhost / ...\nname\tmessages\n")
    quiet = ok(broker, "list_queues", "-q", "--no-table-headers", "name,durable", "arguments")
    assert f'{queue}\tfalse\t[{{"x-max-length",5}}]\n' in quiet.splitlines(keepends=True)
    assert not quiet.startswith("Listing") and "name\tdurable" not in quiet


def test_json_formatter_prints_one_object_per_line_and_no_banner(broker, conn, unique):
    queue = declare_queue(conn.channel(), unique, durable=True)
    out = ok(broker, "list_queues", "name", "durable", "--formatter", "json")
    assert out.startswith("[\n") and out.endswith("]\n")
    assert {"name": queue, "durable": True} in json.loads(out)
    ok(broker, "delete_queue", queue)


def test_exchanges_and_bindings(broker, conn, unique):
    channel = conn.channel()
    queue = declare_queue(channel, unique)
    channel.exchange_declare(f"{unique}-x", "topic", auto_delete=True)
    channel.queue_bind(queue, f"{unique}-x", "a.#")
    assert f"{unique}-x\ttopic\n" in ok(broker, "list_exchanges", "-q")
    out = ok(broker, "list_bindings")
    assert out.startswith("Listing bindings for vhost /...\n"
                          "source_name\tsource_kind\tdestination_name\tdestination_kind\trouting_key\targuments\n")
    assert f"{unique}-x\texchange\t{queue}\tqueue\ta.#\t[]\n" in out
    assert f"\texchange\t{queue}\tqueue\t{queue}\t[]\n" in out  # the default exchange's binding


def test_consumers_and_channels(broker, conn, unique):
    channel = conn.channel()
    queue = declare_queue(channel, unique)
    tag = channel.basic_consume(queue, lambda *delivery: None, consumer_tag=f"{unique}-tag")
    out = wait_for(lambda: ok(broker, "list_consumers", "-q", "--no-table-headers",
                              "queue_name", "consumer_tag", "ack_required", "prefetch_count", "active"),
                   STATS_TIMEOUT, f"the consumer {tag} listed", 0.2,
                   until=lambda out: f"{queue}\t{tag}\ttrue\t0\ttrue\n" in out)
    assert out
    channels = wait_for(lambda: ok(broker, "list_channels", "--formatter", "json", "user", "consumer_count"),
                        STATS_TIMEOUT, "a channel of guest's with one consumer listed", 0.2,
                        until=lambda out: {"user": "guest", "consumer_count": 1} in json.loads(out))
    assert channels


def test_users_added_tagged_given_a_new_password_and_deleted(broker, unique):
    user = f"{unique}-u"
    assert ok(broker, "add_user", user, "first") == f'Adding user "{user}" ...\n'
    assert failed(broker, "add_user", user, "again") == (70, f'Error: User "{user}" already exists')
    assert ok(broker, "set_user_tags", user, "monitoring", "management") == \
        f'Setting tags for user "{user}" to [monitoring, management] ...\n'
    assert f"{user}\t[monitoring, management]\n" in ok(broker, "list_users")
    ok(broker, "change_password", user, "second")
    ok(broker, "set_permissions", user, ".*", ".*", ".*")
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        pika.BlockingConnection(pika.URLParameters(f"amqp://{user}:first@{broker.host}:{broker.port}/%2F"))
    pika.BlockingConnection(pika.URLParameters(f"amqp://{user}:second@{broker.host}:{broker.port}/%2F")).close()
    assert f"{user}\t[monitoring, management]\n" in ok(broker, "list_users"), "tags survive a new password"
    ok(broker, "set_user_tags", user)
    assert f"{user}\t[]\n" in ok(broker, "list_users")
    pika.BlockingConnection(pika.URLParameters(f"amqp://{user}:second@{broker.host}:{broker.port}/%2F")).close()
    assert ok(broker, "delete_user", user) == f'Deleting user "{user}" ...\n'
    assert failed(broker, "delete_user", user) == (67, f'Error: User "{user}" does not exist')
    assert failed(broker, "change_password", user, "x") == (67, f'Error: User "{user}" does not exist')


def test_vhosts_and_permissions(broker, unique):
    vhost, user = f"{unique}-v", f"{unique}-u"
    ok(broker, "add_vhost", vhost)
    ok(broker, "add_user", user, "pw")
    try:
        assert f"\n{vhost}\n" in ok(broker, "list_vhosts")
        assert ok(broker, "set_permissions", "-p", vhost, user, "^a", ".*", "") == \
            f'Setting permissions for user "{user}" in vhost "{vhost}" ...\n'
        listed = ok(broker, "list_permissions", "-p", vhost)
        assert listed.startswith(f'Listing permissions for vhost "{vhost}" ...\nuser\tconfigure\twrite\tread\n')
        assert f"\n{user}\t^a\t.*\t\n" in listed
        assert ok(broker, "list_queues", "-p", vhost) == f"Listing queues for vhost {vhost} ...\n"
        assert failed(broker, "set_permissions", "-p", vhost, f"{user}-x", ".*", ".*", ".*") == \
            (67, f'Error: User "{user}-x" does not exist')
        assert failed(broker, "set_permissions", "-p", f"{vhost}-x", user, ".*", ".*", ".*") == \
            (65, f"Error: Virtual host '{vhost}-x' does not exist")
        assert failed(broker, "set_permissions", "-p", vhost, user, "(", ".*", ".*")[0] == 65
        ok(broker, "clear_permissions", "-p", vhost, user)
        assert f"\n{user}\t" not in ok(broker, "list_permissions", "-p", vhost)
    finally:
        ok(broker, "delete_user", user)
        ok(broker, "delete_vhost", vhost)
    assert f"\n{vhost}\n" not in ok(broker, "list_vhosts")
    assert failed(broker, "delete_vhost", vhost) == (65, f"Error: Virtual host '{vhost}' does not exist")
    assert failed(broker, "list_queues", "-p", vhost) == (65, f"Error: Virtual host '{vhost}' does not exist")


def test_topic_permissions_set_listed_and_cleared(broker, unique):
    vhost, user = f"{unique}-v", f"{unique}-u"
    ok(broker, "add_vhost", vhost)
    ok(broker, "add_user", user, "pw")
    try:
        assert ok(broker, "set_topic_permissions", "-p", vhost, user, "amq.topic", "^a", "^b") == \
            f'Setting topic permissions on "amq.topic" for user "{user}" in vhost "{vhost}" ...\n'
        ok(broker, "set_topic_permissions", "-p", vhost, user, "events", ".*", "")
        assert ok(broker, "list_topic_permissions", "-p", vhost) == (
            f'Listing topic permissions for vhost "{vhost}" ...\nuser\texchange\twrite\tread\n'
            f"{user}\tamq.topic\t^a\t^b\n{user}\tevents\t.*\t\n")
        assert failed(broker, "set_topic_permissions", "-p", vhost, f"{user}-x", "amq.topic", ".*", ".*") == \
            (67, f'Error: User "{user}-x" does not exist')
        assert failed(broker, "set_topic_permissions", "-p", vhost, user, "amq.topic", "(", ".*")[0] == 65
        assert ok(broker, "clear_topic_permissions", "-p", vhost, user, "events") == \
            f'Clearing topic permissions on "events" for user "{user}" in vhost "{vhost}" ...\n'
        assert f"\n{user}\tevents\t" not in ok(broker, "list_topic_permissions", "-p", vhost)
        assert ok(broker, "clear_topic_permissions", "-p", vhost, user) == \
            f'Clearing topic permissions for user "{user}" in vhost "{vhost}" ...\n'
        assert f"\n{user}\t" not in ok(broker, "list_topic_permissions", "-p", vhost)
    finally:
        ok(broker, "delete_user", user)
        ok(broker, "delete_vhost", vhost)


def test_policies_set_listed_and_cleared(broker, unique):
    name = f"{unique}-p"
    assert ok(broker, "set_policy", name, f"^{unique}", '{"max-length":10,"dead-letter-exchange":"dlx"}',
              "--priority", "3", "--apply-to", "queues") == (
        f'Setting policy "{name}" for pattern "^{unique}" to "{{"max-length":10,"dead-letter-exchange":"dlx"}}" '
        f'with priority "3" for vhost "/" ...\n')
    listed = json.loads(ok(broker, "list_policies", "--formatter", "json"))
    assert {"vhost": "/", "name": name, "pattern": f"^{unique}", "apply-to": "queues",
            "definition": '{"dead-letter-exchange":"dlx","max-length":10}', "priority": 3} in listed
    table = ok(broker, "list_policies", "-q")
    assert f'/\t{name}\t^{unique}\tqueues\t{{"dead-letter-exchange":"dlx","max-length":10}}\t3\n' in table
    assert ok(broker, "clear_policy", name) == f'Clearing policy "{name}" on vhost "/" ...\n'
    assert failed(broker, "clear_policy", name) == (69, f'Error: Policy "{name}" does not exist in vhost "/"')
    assert failed(broker, "set_policy", name, ".*", "{bad")[0] == 65
    code, line = failed(broker, "set_policy", name, "(", '{"max-length":1}')
    assert code == 65 and "\n" not in line
    assert name not in ok(broker, "list_policies")


def test_purge_and_delete_queue(broker, conn, unique):
    channel = conn.channel()
    queue = declare_queue(channel, unique)
    publish(channel, queue, [b"1", b"2", b"3"])
    wait_for_message_count(channel, queue, 3)
    assert ok(broker, "purge_queue", queue) == f"Purging queue '{queue}' in vhost '/' ...\n"
    assert channel.queue_declare(queue, passive=True).method.message_count == 0
    publish(channel, queue, [b"4"])
    wait_for_message_count(channel, queue, 1)
    assert failed(broker, "delete_queue", queue, "--if-empty")[0] == 65
    assert queue_exists(conn, queue)
    out = ok(broker, "delete_queue", queue)
    assert out.startswith(f"Deleting queue '{queue}' on vhost '/' ...\nQueue was successfully deleted with ")
    assert not queue_exists(conn, queue)
    assert failed(broker, "delete_queue", queue) == (69, f"Error: Queue '{queue}' does not exist in vhost '/'")
    assert failed(broker, "purge_queue", queue) == (69, f"Error: Queue '{queue}' does not exist in vhost '/'")


def test_close_connection_closes_it_with_320_and_the_reason(broker, unique):
    params = pika.URLParameters(broker.url)
    params.client_properties = {"connection_name": unique}
    target = pika.BlockingConnection(params)

    def named() -> list[dict]:
        listed = json.loads(ok(broker, "list_connections", "name", "client_properties", "--formatter", "json"))
        return [row["name"] for row in listed if (row["client_properties"] or {}).get("connection_name") == unique]

    name = wait_for(named, STATS_TIMEOUT, f"the connection {unique} listed", 0.2)[0]
    assert ok(broker, "close_connection", name, "go away") == f"Closing connection {name}, reason: go away...\n"
    assert connection_error(lambda: wait_until(target, lambda: target.is_closed), target) == \
        (320, "CONNECTION_FORCED - go away")
    assert failed(broker, "close_connection", name, "again")[0] == 69


def test_definitions_exported_and_imported(broker, conn, unique, tmp_path):
    queue = declare_queue(conn.channel(), unique, durable=True)
    try:
        target = tmp_path / "definitions.json"
        assert ok(broker, "export_definitions", str(target)) == \
            f'Exporting definitions in JSON to a file at "{target}" ...\n'
        exported = json.loads(target.read_text())
        assert any(item["name"] == queue for item in exported["queues"])
        assert json.loads(ok(broker, "export_definitions", "-"))["users"]
    finally:
        ok(broker, "delete_queue", queue)
    user, vhost = f"{unique}-u", f"{unique}-v"
    definitions = {"users": [{"name": user, "password": "pw", "tags": "monitoring"}], "vhosts": [{"name": vhost}],
                   "permissions": [{"user": user, "vhost": vhost, "configure": ".*", "write": ".*", "read": ".*"}]}
    source = tmp_path / "import.json"
    source.write_text(json.dumps(definitions))
    assert ok(broker, "import_definitions", str(source)) == \
        f'Importing definitions in JSON from a file at "{source}" ...\n'
    try:
        assert f"{user}\t[monitoring]\n" in ok(broker, "list_users")
        assert f"{user}\t.*\t.*\t.*\n" in ok(broker, "list_permissions", "-p", vhost)
        ok(broker, "delete_user", user)
        ok(broker, "import_definitions", "-", stdin=json.dumps(definitions))
        assert f"{user}\t[monitoring]\n" in ok(broker, "list_users")
    finally:
        ctl(broker, "delete_user", user)
        ctl(broker, "delete_vhost", vhost)
    source.write_text("{not json")
    assert failed(broker, "import_definitions", str(source))[0] == 65
    assert failed(broker, "import_definitions", str(tmp_path / "missing.json")) == \
        (65, f"Error: cannot read {tmp_path / 'missing.json'}: No such file or directory")


def test_status_names_the_node(broker):
    out = ok(broker, "status")
    assert out.startswith("Status of node ") and "\nAlarms\n\n(none)\n" in out


def section(out: str, title: str) -> list[str]:
    """The lines of one section of rabbitmqctl's sectioned output: after its title and a blank line, up to the
    next blank line."""
    lines = out.splitlines()
    start = lines.index(title) + 2
    return lines[start:lines.index("", start)] if "" in lines[start:] else lines[start:]


def test_cluster_status_lists_the_nodes_and_which_are_running(broker):
    out = ok(broker, "cluster_status")
    node = out.splitlines()[0].removeprefix("Cluster status of node ").removesuffix(" ...")
    assert node in section(out, "Disk Nodes") and section(out, "Running Nodes") == section(out, "Disk Nodes")
    assert section(out, "Alarms") == ["(none)"]
    nodes = section(out, "Disk Nodes")
    assert section(out, "Maintenance status") == [f"Node: {name}, status: not under maintenance" for name in nodes]
    status = json.loads(ok(broker, "cluster_status", "--formatter", "json"))
    assert status["running_nodes"] == section(out, "Running Nodes") and status["alarms"] == []
    assert status["maintenance_status"] == dict.fromkeys(nodes, "not under maintenance")


def test_cluster_status_lists_a_node_per_worker(own_broker):
    broker = own_broker("--workers", "2")
    running = section(ok(broker, "cluster_status"), "Running Nodes")
    assert [name.split("@")[0] for name in running] == ["warren-0", "warren-1"]


def test_refused_credentials_exit_77(broker):
    done = ctl(broker, "list_users", password="not-the-password")
    assert done.returncode == 77 and done.stdout == "Listing users ...\n"
    assert done.stderr == "Error: refused by the management API: Login failed\n"


@pytest.mark.skipif(WORKERS > 1, reason="a broker of several workers moves vhosts between them (test_workers.py)")
def test_a_vhosts_leader_is_chosen_only_among_workers(broker):
    for argv in (("set_vhost_leader", "b"), ("move_vhost", "1"), ("move_queue", "q", "1")):
        assert failed(broker, *argv)[1] == (
            "Error: a vhost's leader and group are chosen among the workers of a broker with several ([server] "
            "workers), or the nodes of a cluster; this broker runs one process of its own")
    assert failed(broker, "clear_vhost_leader", "-p", "no-such-vhost")[1] == (
        "Error: Virtual host 'no-such-vhost' does not exist")


def test_maintenance_and_forgetting_a_node_are_for_a_node_of_a_cluster(broker):
    if broker.external:
        pytest.skip("maintenance and forgetting a node through the management API are Warren's own (RabbitMQ's are "
                    "rabbitmq-upgrade drain and rabbitmqctl forget_cluster_node)")
    for verb in ("drain", "revive"):
        assert failed(broker, verb)[1] == "Error: maintenance mode is for a node of a cluster: this broker is not one"
    assert failed(broker, "forget_cluster_node", "other@host")[1] == (
        "Error: forgetting a node is for a node of a cluster: this broker is not one")


def test_a_shovel_set_as_a_parameter_shown_restarted_and_deleted(broker, conn, unique):
    channel = conn.channel()
    source, target, name = declare_queue(channel, f"{unique}-from"), declare_queue(channel, f"{unique}-to"), unique
    value = json.dumps({"src-uri": broker.url, "src-queue": source, "dest-uri": broker.url, "dest-queue": target})
    assert ok(broker, "set_parameter", "shovel", name, value) == (
        f'Setting runtime parameter "{name}" for component "shovel" to "{value}" in vhost "/" ...\n')
    publish(channel, source, [b"moved"])
    wait_for_message_count(channel, target, 1)
    status = wait_for(lambda: json.loads(ok(broker, "shovel_status", "name", "state", "source", "destination_queue",
                                            "--formatter", "json")), 30, "the shovel listed as running",
                      until=lambda rows: {"name": name, "state": "running", "destination_queue": target,
                                          "source": f"amqp://{broker.host}:{broker.port}/%2F"} in rows)
    assert "guest" not in str(status)
    assert ok(broker, "restart_shovel", name) == f"Restarting dynamic Shovel {name} in virtual host /\n"
    assert ok(broker, "delete_shovel", name) == f"Deleting shovel {name} in vhost /\n"
    assert failed(broker, "delete_shovel", name) == (
        69, 'Error: Shovel with the given name was not found in virtual host "/"')
    assert failed(broker, "clear_parameter", "shovel", name)[0] == 69
    code, line = failed(broker, "set_parameter", "shovel", name, '{"src-uri": "amqp://h"}')
    assert code != 0 and "Must specify 'src-exchange' or 'src-queue'" in line


def test_shovel_status_names_the_node_as_rabbitmqctl_does(broker):
    node = request(broker, "GET", "/api/overview").body["node"]
    assert ok(broker, "shovel_status").splitlines()[0] == f"Shovel status on node {node}"


def test_federation_links_listed_down_or_all_and_restarted(broker, conn, unique):
    channel = conn.channel()
    down, up = f"{unique}-down", f"{unique}-up"
    channel.exchange_declare(down, "fanout")
    channel.exchange_declare(up, "fanout")
    upstream = json.dumps({"uri": broker.url, "exchange": up})
    assert ok(broker, "set_parameter", "federation-upstream", unique, upstream) == (
        f'Setting runtime parameter "{unique}" for component "federation-upstream" to "{upstream}" in vhost "/" ...\n')
    try:
        ok(broker, "set_policy", unique, f"^{down}$", json.dumps({"federation-upstream": unique}), "--apply-to",
           "exchanges")
        [link] = wait_for(lambda: [row for row in json.loads(ok(broker, "federation_status", "--formatter", "json"))
                                   if row["exchange"] == down], 30, "the link running",
                          until=lambda rows: [row["status"] for row in rows] == ["running"])
        assert (link["upstream_exchange"], link["type"], link["upstream"]) == (up, "exchange", unique)
        assert json.loads(ok(broker, "federation_status", "--only-down", "--formatter", "json")) == []
        node = request(broker, "GET", "/api/overview").body["node"]
        assert ok(broker, "restart_federation_link", link["id"]) == (
            f"Restarting federation link {link['id']} on node {node}\n")
        assert failed(broker, "restart_federation_link", "nonesuch") == (
            69, "Error: Link with the given ID was not found")
    finally:
        ok(broker, "clear_policy", unique)
        ok(broker, "clear_parameter", "federation-upstream", unique)
