"""The management HTTP API as RabbitMQ's: users, vhosts, permissions, policies, the node, connections, channels and
consumers, with RabbitMQ's JSON shapes, status codes and refusals (every test here passes against RabbitMQ 3.10)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import urllib.error
import urllib.request

import pika
import pika.exceptions
import pytest

from tests.conftest import WORKERS
from tests.integration.helpers import (
    RABBITMQ4, beyond_rabbitmq, connection_error, declare_queue, publish, wait_for_message_count,
)
from tests.integration.management import (
    add_user, add_vhost, connect_as, delete_user, delete_vhost, quote, request, set_permissions, wait_for,
)

NOT_ADMINISTRATOR = {"error": "not_authorised", "reason": "Not administrator user"}
NOT_FOUND = {"error": "Object Not Found", "reason": "Not Found"}


@contextlib.contextmanager
def user(broker, name: str, password: str = "secret", tags: str = ""):
    """A user for the length of a test."""
    add_user(broker, name, password, tags)
    try:
        yield name
    finally:
        delete_user(broker, name)


@contextlib.contextmanager
def vhost(broker, name: str):
    """A vhost for the length of a test (guest, its creator, has full permissions in it)."""
    add_vhost(broker, name)
    try:
        yield name
    finally:
        delete_vhost(broker, name)


def rabbitmq_hash(password: str, salt: bytes = b"\x90\x8d\xbf\x13") -> str:
    """RabbitMQ's password hash: base64(salt + sha256(salt + password))."""
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


# --- authentication and tags -----------------------------------------------------------------------------------
def test_a_request_without_credentials_is_401_with_a_basic_challenge(broker):
    reply = request(broker, "GET", "/api/whoami", user=None)
    assert reply.status == 401
    assert reply.body is None


def test_a_wrong_password_is_401_login_failed(broker):
    reply = request(broker, "GET", "/api/whoami", password="not-the-password")
    assert reply == (401, {"error": "not_authorized", "reason": "Login failed"})


@beyond_rabbitmq
def test_a_pages_own_request_gets_no_basic_challenge_so_the_browser_shows_no_login_dialog(broker):
    def challenge(headers: dict) -> str | None:
        call = urllib.request.Request(broker.management_url + "/api/whoami", headers={
            "authorization": "Basic " + base64.b64encode(b"guest:wrong").decode(), **headers})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(call, timeout=10)
        assert refused.value.code == 401
        return refused.value.headers.get("WWW-Authenticate")

    assert challenge({}) == 'Basic realm="RabbitMQ Management"'
    assert challenge({"X-Requested-With": "XMLHttpRequest"}) is None


def test_whoami_names_the_caller_and_its_tags(broker):
    assert request(broker, "GET", "/api/whoami") == (200, {"name": "guest", "tags": ["administrator"]})


def test_a_user_without_a_management_tag_may_not_use_the_api(broker, unique):
    with user(broker, unique, "pw", tags=""):
        reply = request(broker, "GET", "/api/whoami", user=unique, password="pw")
    assert reply == (401, {"error": "not_authorised", "reason": "Not management user"})


@pytest.mark.parametrize("method, path", [
    ("GET", "/api/users"), ("PUT", "/api/users/someone"), ("DELETE", "/api/users/guest"),
    ("PUT", "/api/vhosts/some-vhost"), ("DELETE", "/api/vhosts/%2F"), ("GET", "/api/vhosts/%2F"),
    ("GET", "/api/permissions"), ("PUT", "/api/permissions/%2F/guest"), ("GET", "/api/users/guest/permissions"),
])
@pytest.mark.parametrize("tags", ["management", "monitoring", "policymaker"])
def test_only_administrators_manage_users_vhosts_and_permissions(broker, unique, method, path, tags):
    """RabbitMQ 3.10 refuses with 401 (not 403) a call the user's tags do not allow."""
    with user(broker, unique, "pw", tags):
        reply = request(broker, method, path, {"password": "x", "tags": "", "configure": ".*", "write": ".*",
                                               "read": ".*"}, user=unique, password="pw")
        assert reply == (401, NOT_ADMINISTRATOR)
        assert request(broker, "GET", "/api/users/someone").status == 404
        assert request(broker, "GET", "/api/vhosts/some-vhost").status == 404


def test_a_management_user_lists_only_the_vhosts_it_has_permissions_in(broker, unique):
    with user(broker, unique, "pw", "management"), vhost(broker, unique + "-mine"), vhost(broker, unique + "-not"):
        set_permissions(broker, unique + "-mine", unique)
        names = [v["name"] for v in request(broker, "GET", "/api/vhosts", user=unique, password="pw").body]
        assert names == [unique + "-mine"]


def test_a_monitoring_user_lists_every_vhost(broker, unique):
    with user(broker, unique, "pw", "monitoring"), vhost(broker, unique + "-v"):
        names = [v["name"] for v in request(broker, "GET", "/api/vhosts", user=unique, password="pw").body]
        assert "/" in names and unique + "-v" in names


@pytest.mark.parametrize("body", [b"{not json", b"[" * 100_000, b'["a list"]'], ids=["broken", "deep", "list"])
def test_bad_json_is_400_bad_request(broker, unique, body):
    reply = request(broker, "PUT", f"/api/users/{quote(unique)}", raw_body=body)
    assert reply.status == 400
    assert reply.body["error"] == "bad_request"
    assert request(broker, "GET", f"/api/users/{quote(unique)}").status == 404


def test_an_unknown_path_is_404_object_not_found(broker):
    assert request(broker, "GET", "/api/no-such-thing") == (404, NOT_FOUND)


@beyond_rabbitmq
@pytest.mark.skipif(WORKERS > 1, reason="a broker of several workers moves vhosts between them (test_workers.py)")
def test_a_vhosts_leader_is_chosen_only_among_workers(broker):
    for method, path, body in (("GET", "leader", None), ("PUT", "leader", {"node": "b"}), ("DELETE", "leader", None),
                               ("PUT", "group", {"group": 1})):
        reply = request(broker, method, f"/api/vhosts/%2F/{path}", body)
        assert reply == (400, {"error": "bad_request", "reason": (
            "a vhost's leader and group are chosen among the workers of a broker with several ([server] workers), "
            "or the nodes of a cluster; this broker runs one process of its own")})
    assert request(broker, "GET", "/api/vhosts/no-such-vhost/leader") == (404, NOT_FOUND)


# --- users -----------------------------------------------------------------------------------------------------
def test_a_user_is_created_updated_shown_and_deleted(broker, unique):
    assert request(broker, "PUT", f"/api/users/{quote(unique)}", {"password": "one", "tags": "management,monitoring"}) \
        .status == 201
    reply = request(broker, "GET", f"/api/users/{quote(unique)}")
    assert reply.status == 200
    assert reply.body["name"] == unique
    assert reply.body["tags"] == ["management", "monitoring"]
    assert reply.body["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    assert reply.body["limits"] == {}
    assert len(base64.b64decode(reply.body["password_hash"])) == 4 + 32

    reply = request(broker, "PUT", f"/api/users/{quote(unique)}", {"password": "two", "tags": ["policymaker"]})
    assert reply.status == 204
    assert request(broker, "GET", f"/api/users/{quote(unique)}").body["tags"] == ["policymaker"]
    assert request(broker, "GET", "/api/whoami", user=unique, password="two").body == {
        "name": unique, "tags": ["policymaker"]}
    assert request(broker, "GET", "/api/whoami", user=unique, password="one").status == 401
    assert unique in [u["name"] for u in request(broker, "GET", "/api/users").body]

    assert request(broker, "DELETE", f"/api/users/{quote(unique)}").status == 204
    assert request(broker, "GET", f"/api/users/{quote(unique)}") == (404, NOT_FOUND)
    assert request(broker, "DELETE", f"/api/users/{quote(unique)}") == (404, NOT_FOUND)


def test_a_user_made_from_a_rabbitmq_password_hash_logs_in_with_its_password(broker, unique):
    reply = request(broker, "PUT", f"/api/users/{quote(unique)}", {
        "password_hash": rabbitmq_hash("from-a-hash"), "hashing_algorithm": "rabbit_password_hashing_sha256",
        "tags": "management"})
    try:
        assert reply.status == 201
        shown = request(broker, "GET", f"/api/users/{quote(unique)}").body
        assert shown["password_hash"] == rabbitmq_hash("from-a-hash")
        assert request(broker, "GET", "/api/whoami", user=unique, password="from-a-hash").status == 200
        set_permissions(broker, "/", unique)
        with connect_as(broker, unique, "from-a-hash") as conn:
            assert conn.is_open
    finally:
        delete_user(broker, unique)


def test_a_user_needs_tags(broker, unique):
    reply = request(broker, "PUT", f"/api/users/{quote(unique)}", {"password": "x"})
    assert reply == (400, {"error": "bad_request", "reason": "tags_not_present"})
    assert request(broker, "GET", f"/api/users/{quote(unique)}").status == 404


def test_a_password_hash_that_is_not_base64_is_400(broker, unique):
    reply = request(broker, "PUT", f"/api/users/{quote(unique)}", {"password_hash": "not base64!", "tags": ""})
    assert reply.status == 400
    assert reply.body["error"] == "bad_request"
    assert request(broker, "GET", f"/api/users/{quote(unique)}").status == 404


def test_deleting_a_user_closes_its_connections(broker, unique):
    add_user(broker, unique, "pw")
    set_permissions(broker, "/", unique)
    conn = connect_as(broker, unique, "pw")
    code, text = connection_error(lambda: request(broker, "DELETE", f"/api/users/{quote(unique)}"), conn)
    assert (code, text) == (320, f"CONNECTION_FORCED - user '{unique}' is deleted")
    assert request(broker, "GET", "/api/permissions/%2F/" + quote(unique)).status == 404


# --- vhosts ----------------------------------------------------------------------------------------------------
def test_a_vhost_is_created_updated_shown_and_deleted(broker, unique):
    path = f"/api/vhosts/{quote(unique)}"
    assert request(broker, "PUT", path, {"description": "first", "tags": "a,b"}).status == 201
    try:
        body = request(broker, "GET", path).body
        assert {key: body[key] for key in ("name", "description", "tags", "metadata", "tracing")} == {
            "name": unique, "description": "first", "tags": ["a", "b"],
            "metadata": {"description": "first", "tags": ["a", "b"]}, "tracing": False}
        assert list(body["cluster_state"].values()) == ["running"]
        assert request(broker, "PUT", path, {"description": "second", "tags": ["c"]}).status == 204
        assert request(broker, "GET", path).body["tags"] == ["c"]
        assert unique in [v["name"] for v in request(broker, "GET", "/api/vhosts").body]
        # as RabbitMQ, the vhost's creator gets full permissions in it
        assert request(broker, "GET", f"{path}/permissions").body == [
            {"user": "guest", "vhost": unique, "configure": ".*", "write": ".*", "read": ".*"}]
    finally:
        assert request(broker, "DELETE", path).status == 204
    assert request(broker, "GET", path) == (404, NOT_FOUND)
    assert request(broker, "DELETE", path) == (404, NOT_FOUND)


def test_a_new_vhost_can_be_used_at_once(broker, unique):
    with vhost(broker, unique):
        with connect_as(broker, "guest", "guest", unique) as conn:
            ch = conn.channel()
            declare_queue(ch, "q")
            publish(ch, "q", [b"in the new vhost"])
            wait_for_message_count(ch, "q", 1)


def vhost_closed_texts(broker, name: str) -> tuple[str, ...]:
    """The texts a connection to a deleted vhost is closed with: Warren's, which is RabbitMQ's, and for RabbitMQ the
    one it sends instead when the vhost's processes stop before the connections are closed (a race)."""
    deleted = f"CONNECTION_FORCED - vhost '{name}' is deleted"
    return (deleted, f"CONNECTION_FORCED - vhost '{name}' is down") if broker.external else (deleted,)


def test_deleting_a_vhost_closes_its_connections(broker, unique):
    add_vhost(broker, unique)
    conn = connect_as(broker, "guest", "guest", unique)
    code, text = connection_error(lambda: request(broker, "DELETE", f"/api/vhosts/{quote(unique)}"), conn)
    assert code == 320 and text in vhost_closed_texts(broker, unique)


def test_deleting_a_vhost_drops_its_queues(broker, unique):
    add_vhost(broker, unique)
    conn = connect_as(broker, "guest", "guest", unique)
    declare_queue(conn.channel(), "doomed", durable=True)
    code, text = connection_error(lambda: request(broker, "DELETE", f"/api/vhosts/{quote(unique)}"), conn)
    assert code == 320 and text in vhost_closed_texts(broker, unique)
    add_vhost(broker, unique)
    try:
        with connect_as(broker, "guest", "guest", unique) as conn:
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
                conn.channel().queue_declare("doomed", passive=True)
            assert closed.value.reply_code == 404
    finally:
        delete_vhost(broker, unique)


def test_connecting_to_a_deleted_vhost_is_refused(broker, unique):
    add_vhost(broker, unique)
    delete_vhost(broker, unique)
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError):
        connect_as(broker, "guest", "guest", unique)


# --- permissions -----------------------------------------------------------------------------------------------
def test_permissions_are_set_listed_and_cleared(broker, unique):
    with user(broker, unique), vhost(broker, unique):
        path = f"/api/permissions/{quote(unique)}/{quote(unique)}"
        expected = {"user": unique, "vhost": unique, "configure": "^c", "write": "^w", "read": ""}
        assert request(broker, "PUT", path, {"configure": "^c", "write": "^w", "read": ""}).status == 201
        assert request(broker, "GET", path) == (200, expected)
        assert request(broker, "GET", f"/api/users/{quote(unique)}/permissions") == (200, [expected])
        assert expected in request(broker, "GET", f"/api/vhosts/{quote(unique)}/permissions").body
        assert expected in request(broker, "GET", "/api/permissions").body
        assert request(broker, "PUT", path, {"configure": ".*", "write": ".*", "read": ".*"}).status == 204
        assert request(broker, "DELETE", path).status == 204
        assert request(broker, "GET", path) == (404, NOT_FOUND)
        assert request(broker, "DELETE", path) == (404, NOT_FOUND)
        assert request(broker, "GET", f"/api/users/{quote(unique)}/permissions") == (200, [])


def test_permissions_take_effect_on_the_next_connection(broker, unique):
    with user(broker, unique, "pw"), vhost(broker, unique):
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError):
            connect_as(broker, unique, "pw", unique)
        set_permissions(broker, unique, unique)
        with connect_as(broker, unique, "pw", unique) as conn:
            assert conn.is_open


def test_permissions_need_all_three_patterns(broker, unique):
    with user(broker, unique):
        reply = request(broker, "PUT", f"/api/permissions/%2F/{quote(unique)}", {"configure": ".*"})
        assert reply == (400, {"error": "bad_request", "reason": "[{key_missing,write},{key_missing,read}]"})


def test_permissions_for_an_unknown_user_or_vhost_are_400(broker, unique):
    body = {"configure": ".*", "write": ".*", "read": ".*"}
    expected = (400, {"error": "bad_request", "reason": "vhost_or_user_not_found"})
    assert request(broker, "PUT", f"/api/permissions/%2F/{quote(unique)}", body) == expected
    assert request(broker, "PUT", f"/api/permissions/{quote(unique)}/guest", body) == expected


def test_a_permission_that_is_not_a_regular_expression_is_400(broker, unique):
    with user(broker, unique):
        path = f"/api/permissions/%2F/{quote(unique)}"
        reply = request(broker, "PUT", path, {"configure": "(", "write": "", "read": ""})
        assert reply.status == 400
        assert reply.body["error"] == "bad_request"
        assert request(broker, "GET", path).status == 404


# --- policies --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["policies", "operator-policies"])
def test_a_policy_is_set_shown_listed_and_cleared(broker, unique, kind):
    with vhost(broker, unique):
        path = f"/api/{kind}/{quote(unique)}/limit"
        body = {"pattern": "^q", "definition": {"max-length": 5}, "priority": 2, "apply-to": "queues"}
        assert request(broker, "PUT", path, body).status == 201
        expected = {"vhost": unique, "name": "limit", "pattern": "^q", "apply-to": "queues",
                    "definition": {"max-length": 5}, "priority": 2}
        assert request(broker, "GET", path) == (200, expected)
        assert request(broker, "GET", f"/api/{kind}/{quote(unique)}") == (200, [expected])
        assert expected in request(broker, "GET", f"/api/{kind}").body
        assert request(broker, "PUT", path, {"pattern": "^r", "definition": {"max-length": 1}}).status == 204
        assert request(broker, "GET", path).body["apply-to"] == "all"
        assert request(broker, "GET", path).body["priority"] == 0
        assert request(broker, "DELETE", path).status == 204
        assert request(broker, "GET", path) == (404, NOT_FOUND)
        assert request(broker, "DELETE", path) == (404, NOT_FOUND)


def test_a_policy_is_listed_by_priority(broker, unique):
    with vhost(broker, unique):
        for name, priority in (("b", 9), ("a", 1), ("c", 5)):
            request(broker, "PUT", f"/api/policies/{quote(unique)}/{name}",
                    {"pattern": "x", "definition": {"max-length": 1}, "priority": priority})
        listed = request(broker, "GET", f"/api/policies/{quote(unique)}").body
        assert [policy["name"] for policy in listed] == ["a", "c", "b"]


def test_a_policy_needs_a_pattern_and_a_definition(broker, unique):
    reply = request(broker, "PUT", f"/api/policies/%2F/{quote(unique)}", {})
    assert reply == (400, {"error": "bad_request", "reason": "[{key_missing,pattern},{key_missing,definition}]"})


@pytest.mark.parametrize("body, reason", [
    ({"pattern": "x", "definition": {"max-length": -1}}, "-1 is not a valid maximum length"),
    ({"pattern": "x", "definition": {"max-length": 1}, "apply-to": "bogus"},
     "apply-to 'bogus' unrecognised; should be 'queues', 'exchanges' or 'all'"),
    ({"pattern": "x", "definition": {}}, "no policy provided"),
    ({"pattern": "x", "definition": {"max-length": 1}, "priority": "5"},
     'priority should be a number, actually was &lt;&lt;"5"&gt;&gt;'),  # RabbitMQ escapes HTML tags here
    ({"pattern": "x", "definition": {"queue-leader-locator": "nearby"}},
     '&lt;&lt;"nearby"&gt;&gt; is not a valid queue leader locator value'),
    pytest.param({"pattern": "x", "definition": {"queue-master-locator": "nearby"}},
                 '&lt;&lt;"nearby"&gt;&gt; is not a valid master locator', marks=RABBITMQ4),  # 3.x: "invalid ... value"
], ids=["max-length", "apply-to", "empty", "priority", "leader-locator", "master-locator"])
def test_a_bad_policy_is_400_with_rabbitmqs_reason(broker, unique, body, reason):
    reply = request(broker, "PUT", f"/api/policies/%2F/{quote(unique)}", body)
    assert reply == (400, {"error": "bad_request", "reason": f"Validation failed\n\n{reason}\n"})
    assert request(broker, "GET", f"/api/policies/%2F/{quote(unique)}").status == 404


def test_an_operator_policy_takes_only_limits(broker, unique):
    reply = request(broker, "PUT", f"/api/operator-policies/%2F/{quote(unique)}",
                    {"pattern": "x", "definition": {"dead-letter-exchange": "dlx"}})
    assert reply == (400, {"error": "bad_request", "reason": 'Validation failed\n\n[{<<"dead-letter-exchange">>,'
                                                     '<<"dlx">>}] are not recognised policy settings\n'})


def test_a_policy_in_a_missing_vhost_is_404(broker, unique):
    reply = request(broker, "PUT", f"/api/policies/{quote(unique)}/p",
                    {"pattern": "x", "definition": {"max-length": 1}})
    assert reply == (404, {"error": "not_found", "reason": "vhost_not_found"})
    assert request(broker, "GET", f"/api/policies/{quote(unique)}") == (404, NOT_FOUND)


def test_policymakers_set_policies_in_their_vhosts_only(broker, unique):
    refused = (401, {"error": "not_authorised", "reason": "User not authorised to access object"})
    body = {"pattern": "x", "definition": {"max-length": 1}}
    with user(broker, unique, "pw", "policymaker"), user(broker, unique + "-m", "pw", "management"), \
            vhost(broker, unique):
        set_permissions(broker, unique, unique)
        set_permissions(broker, unique, unique + "-m")
        path = f"/api/policies/{quote(unique)}/p"
        assert request(broker, "PUT", path, body, user=unique, password="pw").status == 201
        assert request(broker, "PUT", f"/api/policies/%2F/{quote(unique)}", body, user=unique, password="pw") == refused
        assert request(broker, "PUT", path, body, user=unique + "-m", password="pw") == refused
        assert request(broker, "GET", path, user=unique + "-m", password="pw") == refused
        # a management user lists the policies of its vhosts, but reads or changes none
        assert [p["name"] for p in request(broker, "GET", f"/api/policies/{quote(unique)}", user=unique + "-m",
                                           password="pw").body] == ["p"]
        assert request(broker, "PUT", f"/api/operator-policies/{quote(unique)}/o", body, user=unique,
                       password="pw") == (401, NOT_ADMINISTRATOR)
        assert request(broker, "DELETE", path, user=unique, password="pw").status == 204


def test_a_policy_lists_only_the_vhosts_the_user_has_permissions_in(broker, unique):
    with user(broker, unique, "pw", "monitoring"), vhost(broker, unique):
        request(broker, "PUT", f"/api/policies/{quote(unique)}/p", {"pattern": "x", "definition": {"max-length": 1}})
        assert unique not in [p["vhost"] for p in request(broker, "GET", "/api/policies", user=unique,
                                                             password="pw").body]
        reply = request(broker, "GET", f"/api/policies/{quote(unique)}", user=unique, password="pw")
        assert reply == (401, {"error": "not_authorised", "reason": "User not authorised to access virtual host"})


# --- the node --------------------------------------------------------------------------------------------------
def test_the_overview_names_versions_and_counts_objects(broker, unique):
    with vhost(broker, unique):
        body = request(broker, "GET", "/api/overview").body
        for key in ("management_version", "rabbitmq_version", "product_name", "product_version", "cluster_name",
                    "node"):
            assert isinstance(body[key], str) and body[key]
        assert {"direct", "fanout", "topic", "headers"} <= {kind["name"] for kind in body["exchange_types"]}
        assert body["object_totals"]["exchanges"] >= 2 * 6  # the amq.* set of two vhosts at least
        assert "amqp" in {listener["protocol"] for listener in body["listeners"]}
        assert broker.port in {listener["port"] for listener in body["listeners"]}


def test_nodes_show_the_node_with_its_alarms(broker):
    nodes = request(broker, "GET", "/api/nodes").body
    assert len(nodes) == (1 if broker.external else WORKERS)  # one per worker process
    node = nodes[0]
    assert node["running"] is True
    assert node["mem_alarm"] is False and node["disk_free_alarm"] is False
    # not in maintenance (warrenctl drain, in a cluster): RabbitMQ 4's field, which Warren shows (3.10 has none)
    assert node.get("being_drained", False) is False and (broker.external or "being_drained" in node)
    assert node["mem_used"] > 0 and node["mem_limit"] > 0 and node["fd_total"] > 0
    assert request(broker, "GET", f"/api/nodes/{quote(node['name'])}").body["name"] == node["name"]


def test_nodes_give_only_the_columns_asked_for(broker):
    nodes = request(broker, "GET", "/api/nodes?columns=name,running").body
    assert nodes and all(set(node) == {"name", "running"} and node["running"] is True for node in nodes)


def test_nodes_are_for_monitoring_users(broker, unique):
    with user(broker, unique, "pw", "management"):
        reply = request(broker, "GET", "/api/nodes", user=unique, password="pw")
    assert reply == (401, {"error": "not_authorised", "reason": "Not monitor user"})


def test_the_cluster_name(broker):
    reply = request(broker, "GET", "/api/cluster-name")
    assert reply.status == 200 and isinstance(reply.body["name"], str) and reply.body["name"]


@pytest.mark.parametrize("check", ["alarms", "local-alarms", "virtual-hosts"])
def test_health_checks_pass_on_a_healthy_node(broker, check):
    assert request(broker, "GET", f"/api/health/checks/{check}") == (200, {"status": "ok"})


def test_the_port_listener_check_knows_the_amqp_port(broker):
    assert request(broker, "GET", f"/api/health/checks/port-listener/{broker.port}") == (
        200, {"status": "ok", "port": broker.port})
    reply = request(broker, "GET", "/api/health/checks/port-listener/1")
    assert reply.status == 503
    assert reply.body["status"] == "failed" and reply.body["reason"] == "No active listener"
    assert broker.port in reply.body["ports"]


def test_the_listener_checks_know_the_prometheus_listener(broker):
    assert request(broker, "GET", f"/api/health/checks/port-listener/{broker.prometheus_port}") == (
        200, {"status": "ok", "port": broker.prometheus_port})
    assert request(broker, "GET", "/api/health/checks/protocol-listener/http%2Fprometheus") == (
        200, {"status": "ok", "protocol": "http/prometheus"})


def test_the_protocol_listener_check(broker):
    assert request(broker, "GET", "/api/health/checks/protocol-listener/amqp091") == (
        200, {"status": "ok", "protocol": "amqp"})
    reply = request(broker, "GET", "/api/health/checks/protocol-listener/mqtt")
    assert reply.status == 503 and reply.body["missing"] == "mqtt"


def test_the_aliveness_test_sends_a_message_through_a_queue_of_its_own(broker, unique):
    with vhost(broker, unique):
        assert request(broker, "GET", f"/api/aliveness-test/{quote(unique)}") == (200, {"status": "ok"})
        # the message went through it and back: RabbitMQ's stats show an empty queue after their next tick
        queue = wait_for(broker, f"/api/queues/{quote(unique)}/aliveness-test",
                         lambda body: body.get("messages_ready") == 0)
        assert queue["durable"] is False


def test_the_aliveness_test(broker, unique):
    assert request(broker, "GET", "/api/aliveness-test/%2F") == (200, {"status": "ok"})
    assert request(broker, "GET", f"/api/aliveness-test/{quote(unique)}") == (404, NOT_FOUND)
    with user(broker, unique, "pw", "monitoring"):
        reply = request(broker, "GET", "/api/aliveness-test/%2F", user=unique, password="pw")
    assert reply == (401, {"error": "not_authorised", "reason": "User not authorised to access virtual host"})


# --- connections, channels, consumers --------------------------------------------------------------------------
def own_connection(broker, conn, path="/api/connections"):
    """The API's view of conn, found by its client-provided name (RabbitMQ lists it after its next stats tick)."""
    name = conn._impl.params.client_properties["connection_name"]
    listed = wait_for(broker, path, lambda body: any(c.get("user_provided_name") == name for c in body))
    return next(c for c in listed if c.get("user_provided_name") == name)


def named_connection(broker, unique, user="guest", password="guest", vhost="/"):
    return pika.BlockingConnection(pika.ConnectionParameters(
        broker.host, broker.port, vhost, pika.PlainCredentials(user, password),
        client_properties={"connection_name": unique}))


def test_a_connection_its_channels_and_consumers_are_listed(broker, unique):
    with named_connection(broker, unique) as conn:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=7)
        queue = declare_queue(ch, unique, auto_delete=True)
        ch.basic_consume(queue, lambda *args: None, consumer_tag="tag-1", arguments={"x-priority": 3})
        listed = own_connection(broker, conn)
        assert listed["vhost"] == "/" and listed["user"] == "guest" and listed["protocol"] == "AMQP 0-9-1"
        assert listed["name"] == f"{listed['peer_host']}:{listed['peer_port']} -> {listed['host']}:{broker.port}"
        assert listed["client_properties"]["connection_name"] == unique
        name = listed["name"]
        assert request(broker, "GET", f"/api/connections/{quote(name)}").body["name"] == name
        assert name in [c["name"] for c in request(broker, "GET", "/api/vhosts/%2F/connections").body]

        channel_name = f"{name} (1)"
        channels = wait_for(broker, f"/api/connections/{quote(name)}/channels", lambda body: len(body) == 1)
        assert channels[0]["name"] == channel_name and channels[0]["number"] == 1
        assert channels[0]["prefetch_count"] == 7 and channels[0]["consumer_count"] == 1
        assert channels[0]["connection_details"]["name"] == name
        assert channel_name in [c["name"] for c in request(broker, "GET", "/api/channels").body]
        detail = request(broker, "GET", f"/api/channels/{quote(channel_name)}").body
        assert [c["consumer_tag"] for c in detail["consumer_details"]] == ["tag-1"]

        consumers = wait_for(broker, "/api/consumers/%2F",
                             lambda body: any(c["queue"]["name"] == queue for c in body))
        consumer = next(c for c in consumers if c["queue"]["name"] == queue)
        assert consumer["consumer_tag"] == "tag-1" and consumer["arguments"] == {"x-priority": 3}
        assert consumer["ack_required"] is True and consumer["prefetch_count"] == 7
        assert consumer["channel_details"]["name"] == channel_name


def test_closing_a_connection_sends_320_with_the_given_reason(broker, unique):
    conn = named_connection(broker, unique)
    name = own_connection(broker, conn)["name"]
    code, text = connection_error(lambda: request(broker, "DELETE", f"/api/connections/{quote(name)}",
                                                  headers={"X-Reason": "maintenance window"}), conn)
    assert (code, text) == (320, "CONNECTION_FORCED - maintenance window")


def test_closing_a_connection_without_a_reason_says_it_came_from_the_api(broker, unique):
    conn = named_connection(broker, unique)
    name = own_connection(broker, conn)["name"]
    code, text = connection_error(lambda: request(broker, "DELETE", f"/api/connections/{quote(name)}"), conn)
    assert (code, text) == (320, "CONNECTION_FORCED - Closed via management plugin")


def test_a_missing_connection_is_404(broker):
    path = "/api/connections/" + quote("127.0.0.1:1 -> 127.0.0.1:2")
    assert request(broker, "GET", path) == (404, NOT_FOUND)
    assert request(broker, "GET", "/api/channels/" + quote("127.0.0.1:1 -> 127.0.0.1:2 (1)")) == (404, NOT_FOUND)


def test_a_management_user_sees_and_closes_only_its_own_connections(broker, unique):
    refused = (401, {"error": "not_authorised", "reason": "User not authorised to access object"})
    with user(broker, unique, "pw", "management"):
        set_permissions(broker, "/", unique)
        with named_connection(broker, unique + "-guest") as guests, \
                named_connection(broker, unique + "-own", unique, "pw") as own:
            guest_name = own_connection(broker, guests)["name"]
            own_name = own_connection(broker, own)["name"]
            listed = [c["name"] for c in request(broker, "GET", "/api/connections", user=unique, password="pw").body]
            assert own_name in listed and guest_name not in listed
            assert request(broker, "GET", f"/api/connections/{quote(guest_name)}", user=unique,
                           password="pw") == refused
            assert request(broker, "DELETE", f"/api/connections/{quote(guest_name)}", user=unique,
                           password="pw") == refused
            assert guests.is_open
            code, _ = connection_error(lambda: request(broker, "DELETE", f"/api/connections/{quote(own_name)}",
                                                       user=unique, password="pw"), own)
            assert code == 320


def test_the_alarm_checks_fail_while_an_alarm_is_on(own_broker, tmp_path):
    config = tmp_path / "warren.toml"
    config.write_text("[server]\nmemory_limit = 1\n")  # any broker is above one byte: the alarm is on from the start
    alarmed = own_broker("--config", str(config))
    body = wait_for(alarmed, "/api/nodes", lambda nodes: nodes[0]["mem_alarm"])[0]
    for check, reason in (("alarms", "There are alarms in effect in the cluster"),
                          ("local-alarms", "There are alarms in effect on the node")):
        assert request(alarmed, "GET", f"/api/health/checks/{check}") == (503, {
            "status": "failed", "reason": reason, "alarms": [{"resource": "memory", "node": body["name"]}]})


def test_changes_are_on_disk_when_the_api_answers(own_broker, unique):
    """Killed right after the replies, the broker comes back with every user, vhost, permission and policy."""
    node = own_broker()
    add_vhost(node, unique)
    add_user(node, unique, "pw", "policymaker")
    set_permissions(node, unique, unique, "^c", ".*", ".*")
    assert request(node, "PUT", f"/api/policies/{quote(unique)}/p", {"pattern": "^q", "definition": {
        "max-length": 2}}).status == 201
    assert request(node, "DELETE", "/api/permissions/%2F/guest").status == 204
    node.kill()
    node.start()
    assert request(node, "GET", f"/api/vhosts/{quote(unique)}").status == 200
    assert request(node, "GET", "/api/whoami", user=unique, password="pw").body["tags"] == ["policymaker"]
    assert request(node, "GET", f"/api/permissions/{quote(unique)}/{quote(unique)}").body["configure"] == "^c"
    assert request(node, "GET", f"/api/policies/{quote(unique)}/p").body["definition"] == {"max-length": 2}
    assert request(node, "GET", "/api/permissions/%2F/guest").status == 404
    with connect_as(node, unique, "pw", unique) as conn:
        assert conn.is_open


@pytest.mark.parametrize("tags", ["monitoring", "management"])
def test_a_vhosts_connections_and_channels_need_permissions_there(broker, unique, tags):
    refused = (401, {"error": "not_authorised", "reason": "User not authorised to access virtual host"})
    with user(broker, unique, "pw", tags), vhost(broker, unique):
        for path in (f"/api/vhosts/{quote(unique)}/connections", f"/api/vhosts/{quote(unique)}/channels"):
            assert request(broker, "GET", path, user=unique, password="pw") == refused
        set_permissions(broker, unique, unique)
        for path in (f"/api/vhosts/{quote(unique)}/connections", f"/api/vhosts/{quote(unique)}/channels"):
            assert request(broker, "GET", path, user=unique, password="pw") == (200, [])
        assert request(broker, "GET", f"/api/consumers/{quote(unique)}-missing") == (404, NOT_FOUND)


def test_listings_keep_only_the_columns_asked_for(broker):
    assert {"name": "guest"} in request(broker, "GET", "/api/users?columns=name").body
    assert {"name": "/", "tags": []} in request(broker, "GET", "/api/vhosts?columns=name,tags").body
    assert {"vhost": "/", "user": "guest"} in request(broker, "GET", "/api/permissions?columns=vhost,user").body


def test_vhosts_connections_and_channels_come_in_pages(broker, unique):
    with vhost(broker, unique + "-a"), vhost(broker, unique + "-b"):
        page = request(broker, "GET", f"/api/vhosts?page=1&page_size=1&name={quote(unique)}").body
        assert (page["filtered_count"], page["item_count"], page["page_count"]) == (2, 1, 2)
        assert [v["name"] for v in page["items"]] == [unique + "-a"]
    for path in ("/api/connections", "/api/channels"):
        page = request(broker, "GET", f"{path}?page=1&name={quote(unique)}").body
        assert (page["page"], page["filtered_count"], page["items"]) == (1, 0, [])


def test_a_user_updated_without_a_password_can_no_longer_log_in_with_one(broker, unique):
    with user(broker, unique, "old", "management"):
        assert request(broker, "PUT", f"/api/users/{quote(unique)}", {"tags": "monitoring"}).status == 204
        assert request(broker, "GET", "/api/whoami", user=unique, password="old") == (
            401, {"error": "not_authorized", "reason": "Login failed"})
        assert request(broker, "GET", f"/api/users/{quote(unique)}").body["tags"] == ["monitoring"]
