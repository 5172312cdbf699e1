"""The management HTTP API as RabbitMQ's: users, vhosts, permissions, policies, the node, connections, channels and
consumers, with RabbitMQ's JSON shapes, status codes and refusals (every test here passes against RabbitMQ 3.10)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os

import pika
import pika.exceptions
import pytest

from tests.integration.helpers import connection_error, declare_queue, publish, wait_for_message_count
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


def test_bad_json_is_400_bad_request(broker, unique):
    reply = request(broker, "PUT", f"/api/users/{unique}", raw_body=b"{not json")
    assert reply.status == 400
    assert reply.body["error"] == "bad_request"
    assert request(broker, "GET", f"/api/users/{unique}").status == 404


def test_an_unknown_path_is_404_object_not_found(broker):
    assert request(broker, "GET", "/api/no-such-thing") == (404, NOT_FOUND)


# --- users -----------------------------------------------------------------------------------------------------
def test_a_user_is_created_updated_shown_and_deleted(broker, unique):
    assert request(broker, "PUT", f"/api/users/{unique}", {"password": "one", "tags": "management,monitoring"}) \
        .status == 201
    reply = request(broker, "GET", f"/api/users/{unique}")
    assert reply.status == 200
    assert reply.body["name"] == unique
    assert reply.body["tags"] == ["management", "monitoring"]
    assert reply.body["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    assert reply.body["limits"] == {}
    assert len(base64.b64decode(reply.body["password_hash"])) == 4 + 32

    assert request(broker, "PUT", f"/api/users/{unique}", {"password": "two", "tags": ["policymaker"]}).status == 204
    assert request(broker, "GET", f"/api/users/{unique}").body["tags"] == ["policymaker"]
    assert request(broker, "GET", "/api/whoami", user=unique, password="two").body == {
        "name": unique, "tags": ["policymaker"]}
    assert request(broker, "GET", "/api/whoami", user=unique, password="one").status == 401
    assert unique in [u["name"] for u in request(broker, "GET", "/api/users").body]

    assert request(broker, "DELETE", f"/api/users/{unique}").status == 204
    assert request(broker, "GET", f"/api/users/{unique}") == (404, NOT_FOUND)
    assert request(broker, "DELETE", f"/api/users/{unique}") == (404, NOT_FOUND)


def test_a_user_made_from_a_rabbitmq_password_hash_logs_in_with_its_password(broker, unique):
    reply = request(broker, "PUT", f"/api/users/{unique}", {
        "password_hash": rabbitmq_hash("from-a-hash"), "hashing_algorithm": "rabbit_password_hashing_sha256",
        "tags": "management"})
    try:
        assert reply.status == 201
        assert request(broker, "GET", f"/api/users/{unique}").body["password_hash"] == rabbitmq_hash("from-a-hash")
        assert request(broker, "GET", "/api/whoami", user=unique, password="from-a-hash").status == 200
        set_permissions(broker, "/", unique)
        with connect_as(broker, unique, "from-a-hash") as conn:
            assert conn.is_open
    finally:
        delete_user(broker, unique)


def test_a_user_needs_tags(broker, unique):
    reply = request(broker, "PUT", f"/api/users/{unique}", {"password": "x"})
    assert reply == (400, {"error": "bad_request", "reason": "tags_not_present"})
    assert request(broker, "GET", f"/api/users/{unique}").status == 404


def test_a_password_hash_that_is_not_base64_is_400(broker, unique):
    reply = request(broker, "PUT", f"/api/users/{unique}", {"password_hash": "not base64!", "tags": ""})
    assert reply.status == 400
    assert reply.body["error"] == "bad_request"
    assert request(broker, "GET", f"/api/users/{unique}").status == 404


def test_deleting_a_user_closes_its_connections(broker, unique):
    add_user(broker, unique, "pw")
    set_permissions(broker, "/", unique)
    conn = connect_as(broker, unique, "pw")
    code, text = connection_error(lambda: request(broker, "DELETE", f"/api/users/{unique}"), conn)
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


def test_deleting_a_vhost_closes_its_connections(broker, unique):
    add_vhost(broker, unique)
    conn = connect_as(broker, "guest", "guest", unique)
    code, text = connection_error(lambda: request(broker, "DELETE", f"/api/vhosts/{quote(unique)}"), conn)
    assert (code, text) == (320, f"CONNECTION_FORCED - vhost '{unique}' is deleted")


def test_deleting_a_vhost_drops_its_queues(broker, unique):
    add_vhost(broker, unique)
    conn = connect_as(broker, "guest", "guest", unique)
    declare_queue(conn.channel(), "doomed", durable=True)
    code, text = connection_error(lambda: request(broker, "DELETE", f"/api/vhosts/{quote(unique)}"), conn)
    # RabbitMQ says "is down" instead when the vhost's queues stop before the connections are closed
    assert code == 320 and text in (f"CONNECTION_FORCED - vhost '{unique}' is deleted",
                                    f"CONNECTION_FORCED - vhost '{unique}' is down")
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
