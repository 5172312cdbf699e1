"""Definitions import and export (broker.model.definitions) on a node kept in memory: RabbitMQ's JSON in and out,
users keep their passwords, a bad item is refused by name before anything changes, and what RabbitMQ skips is
skipped."""

from __future__ import annotations

import copy
import logging

import pytest

from broker.model.access import hash_password
from broker.model.definitions import DefinitionsError, export_node, export_vhost, import_definitions
from broker.model.node import Node

# Users as the reference RabbitMQ 3.10.8 exported them, with the passwords they were created with.
ALICE = {"name": "alice", "password_hash": "rKXnUP4htXFEykdVetqYH4AoIDOS/HGdFMHuHAL5nRHjmQIF",
         "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": ["monitoring", "policymaker"], "limits": {}}
ALICE_PASSWORD = "secret"
BOB = {"name": "bob", "password_hash": "p+Hnae8wmkCIQziOena0oBWDRU/R8nKTxMvyjIC/cKR3TRDM",
       "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": [], "limits": {}}
BOB_PASSWORD = "pw"

# Part of that export: a vhost, permissions, a topic permission, a policy, an operator policy, queues, exchanges and
# bindings.
RABBITMQ_EXPORT = {
    "rabbit_version": "3.10.8", "rabbitmq_version": "3.10.8", "product_name": "RabbitMQ",
    "product_version": "3.10.8",
    "users": [BOB, ALICE],
    "vhosts": [{"name": "/"}, {"name": "v1"}],
    "permissions": [{"user": "alice", "vhost": "v1", "configure": "^a", "write": ".*", "read": ""}],
    "topic_permissions": [{"user": "alice", "vhost": "v1", "exchange": "x2", "write": "^a", "read": ""}],
    "parameters": [{"value": {"pattern": ".*", "definition": {"max-length": 10}, "priority": 0,
                              "apply-to": "queues"}, "vhost": "v1", "component": "operator_policy", "name": "cap"}],
    "global_parameters": [{"name": "internal_cluster_id", "value": "rabbitmq-cluster-id-TEQUbq6RogYkRBm8q7nw5w"}],
    "policies": [{"vhost": "v1", "name": "dlx", "pattern": "^q", "apply-to": "queues",
                  "definition": {"dead-letter-exchange": "dlx", "message-ttl": 100}, "priority": 3}],
    "queues": [{"name": "q2", "vhost": "v1", "durable": False, "auto_delete": False, "arguments": {}},
               {"name": "q1", "vhost": "v1", "durable": True, "auto_delete": False,
                "arguments": {"x-max-length": 5}},
               {"name": "qq", "vhost": "v1", "durable": True, "auto_delete": False,
                "arguments": {"x-queue-type": "quorum"}}],
    "exchanges": [{"name": "dlx", "vhost": "v1", "type": "fanout", "durable": True, "auto_delete": False,
                   "internal": False, "arguments": {}},
                  {"name": "x2", "vhost": "v1", "type": "topic", "durable": True, "auto_delete": False,
                   "internal": True, "arguments": {"alternate-exchange": "dlx"}}],
    "bindings": [{"source": "amq.direct", "vhost": "v1", "destination": "q1", "destination_type": "queue",
                  "routing_key": "z", "arguments": {}},
                 {"source": "dlx", "vhost": "v1", "destination": "q1", "destination_type": "queue",
                  "routing_key": "k", "arguments": {"a": 1}},
                 {"source": "x2", "vhost": "v1", "destination": "dlx", "destination_type": "exchange",
                  "routing_key": "#", "arguments": {}}],
}


def imported(document: dict) -> Node:
    node = Node()
    import_definitions(node, copy.deepcopy(document))
    return node


def without(items: list[dict], key: str) -> list[dict]:
    return [{k: v for k, v in item.items() if k != key} for item in items]


def test_a_rabbitmq_export_imports_and_its_users_log_in_with_their_passwords():
    node = imported(RABBITMQ_EXPORT)
    assert node.authenticate("alice", ALICE_PASSWORD) is not None
    assert node.authenticate("bob", BOB_PASSWORD) is not None
    assert node.authenticate("alice", "wrong") is None
    assert node.users["alice"].tags == ["monitoring", "policymaker"]
    permission = node.permissions["v1", "alice"]
    assert (permission.configure, permission.write, permission.read) == ("^a", ".*", "")
    topic = node.topic_permissions["v1", "alice"]["x2"]
    assert (topic.write, topic.read) == ("^a", "")
    vhost = node.vhosts["v1"]
    assert vhost.policies["dlx"].definition == {"dead-letter-exchange": "dlx", "message-ttl": 100}
    assert vhost.operator_policies["cap"].definition == {"max-length": 10}
    assert {name: queue.durable for name, queue in vhost.queues.items()} == {"q2": False, "q1": True, "qq": True}
    assert vhost.queues["q1"].policy is vhost.policies["dlx"]
    assert vhost.exchanges["x2"].internal and vhost.exchanges["x2"].arguments == {"alternate-exchange": "dlx"}
    q1 = vhost.queues["q1"]
    assert {(b.source.name, b.routing_key) for b in q1.bindings} == {("amq.direct", "z"), ("dlx", "k")}
    assert [b.destination.name for b in vhost.exchanges["x2"].bindings.values()] == ["dlx"]


def test_the_export_has_rabbitmqs_shape_and_imports_into_an_empty_node_unchanged():
    exported = export_node(imported(RABBITMQ_EXPORT), "Warren", "1.2.3")
    assert list(exported) == ["rabbit_version", "rabbitmq_version", "product_name", "product_version", "users",
                              "vhosts", "permissions", "topic_permissions", "parameters", "global_parameters",
                              "policies", "queues", "exchanges", "bindings"]
    assert (exported["product_name"], exported["product_version"]) == ("Warren", "1.2.3")
    assert exported["users"] == [BOB, ALICE]
    assert exported["permissions"] == RABBITMQ_EXPORT["permissions"]
    assert exported["topic_permissions"] == RABBITMQ_EXPORT["topic_permissions"]
    assert exported["parameters"] == RABBITMQ_EXPORT["parameters"]
    assert exported["policies"] == RABBITMQ_EXPORT["policies"]
    for section in ("queues", "exchanges"):
        assert sorted(exported[section], key=lambda item: item["name"]) == sorted(
            RABBITMQ_EXPORT[section], key=lambda item: item["name"])
    key = lambda item: (item["source"], item["destination"])  # noqa: E731
    assert sorted(exported["bindings"], key=key) == sorted(RABBITMQ_EXPORT["bindings"], key=key)
    again = export_node(imported(exported), "Warren", "1.2.3")
    assert again == exported


def test_a_vhost_export_names_no_vhost_and_has_no_users():
    exported = export_vhost(imported(RABBITMQ_EXPORT).vhosts["v1"])
    assert list(exported) == ["rabbit_version", "parameters", "policies", "queues", "exchanges", "bindings"]
    assert exported["queues"][0] == {"name": "q2", "durable": False, "auto_delete": False, "arguments": {}}
    assert exported["policies"] == without(RABBITMQ_EXPORT["policies"], "vhost")
    assert exported["parameters"] == RABBITMQ_EXPORT["parameters"]  # RabbitMQ keeps their vhost


def test_a_vhost_import_takes_the_vhost_it_is_given_and_ignores_users():
    node = imported({"vhosts": [{"name": "v2"}]})
    document = export_vhost(imported(RABBITMQ_EXPORT).vhosts["v1"])
    import_definitions(node, {**document, "users": [BOB]}, vhost="v2")
    assert set(node.vhosts["v2"].queues) == {"q1", "q2", "qq"}
    assert set(node.vhosts["v2"].policies) == {"dlx"}
    assert "bob" not in node.users


def test_exclusive_queues_and_the_predeclared_exchanges_are_not_exported():
    node = imported({"vhosts": [{"name": "/"}]})

    class Connection:
        exclusive_queues: set = set()

    node.vhosts["/"].declare_queue("mine", Connection(), False, False, True, False, {})
    exported = export_node(node, "Warren", "1")
    assert exported["queues"] == [] and exported["exchanges"] == [] and exported["bindings"] == []


def test_tags_may_be_a_comma_separated_string_and_a_user_may_come_with_a_password():
    node = imported({"users": [{"name": "carol", "password": "pass", "tags": "administrator, management"}]})
    assert node.users["carol"].tags == ["administrator", "management"]
    assert node.authenticate("carol", "pass") is not None


def test_a_vhost_keeps_the_description_and_tags_an_import_leaves_out():
    node = imported({"vhosts": [{"name": "v", "description": "production", "tags": ["eu"]}]})
    import_definitions(node, {"vhosts": [{"name": "v"}]})
    assert (node.vhosts["v"].description, node.vhosts["v"].tags) == ("production", ["eu"])
    import_definitions(node, {"vhosts": [{"name": "v", "metadata": {"description": "staging", "tags": []}}]})
    assert (node.vhosts["v"].description, node.vhosts["v"].tags) == ("staging", [])


def test_users_of_an_export_older_than_rabbitmq_3_6_have_md5_hashes():
    md5_hash = hash_password("old", "rabbit_password_hashing_md5")
    node = imported({"rabbit_version": "3.5.7", "users": [{"name": "old", "password_hash": md5_hash, "tags": ""}]})
    assert node.authenticate("old", "old") is not None
    with pytest.raises(DefinitionsError, match="password_hash is not a base64-encoded salted hash of "
                                               "rabbit_password_hashing_sha256"):
        imported({"rabbit_version": "3.10.8", "users": [{"name": "old", "password_hash": md5_hash}]})


def test_an_import_overwrites_what_it_names_and_leaves_the_rest():
    node = imported(RABBITMQ_EXPORT)
    import_definitions(node, {"users": [{**ALICE, "tags": ["administrator"]}]})
    assert node.users["alice"].tags == ["administrator"]
    assert node.authenticate("bob", BOB_PASSWORD) is not None


@pytest.mark.parametrize("document, reason", [
    ({"vhosts": "v1"}, "'vhosts' must be a list, got str"),
    ({"vhosts": [7]}, "vhosts[0]: not a JSON object"),
    ({"vhosts": [{"description": "x"}]}, "vhosts[0]: 'name' is missing"),
    ({"users": [{**BOB, "password_hash": "xx"}]},
     "user 'bob': password_hash is not a base64-encoded salted hash of rabbit_password_hashing_sha256"),
    ({"users": [{**BOB, "hashing_algorithm": "rot13"}]}, "user 'bob': unknown hashing_algorithm 'rot13'"),
    ({"users": [{**BOB, "tags": 3}]}, "user 'bob': 'tags' must be a list of strings or a comma-separated string"),
    ({"permissions": [{"user": "ghost", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}]},
     "permission of user 'ghost' in vhost '/': no user 'ghost'"),
    ({"permissions": [{"user": "guest", "vhost": "nope", "configure": ".*", "write": ".*", "read": ".*"}]},
     "permission of user 'guest': no vhost 'nope'"),
    ({"permissions": [{"user": "guest", "vhost": "/", "configure": "(", "write": ".*", "read": ".*"}]},
     "permission of user 'guest' in vhost '/': 'configure' is not a valid regular expression"),
    ({"topic_permissions": [{"user": "ghost", "vhost": "/", "exchange": "t", "write": ".*", "read": ".*"}]},
     "topic permission of user 'ghost' in vhost '/' on exchange 't': no user 'ghost'"),
    ({"topic_permissions": [{"user": "guest", "vhost": "/", "write": ".*", "read": ".*"}]},
     "topic permission of user 'guest': "),
    ({"topic_permissions": [{"user": "guest", "vhost": "/", "exchange": "t", "write": ".*", "read": "("}]},
     "topic permission of user 'guest' in vhost '/' on exchange 't': not a valid regular expression"),
    ({"queues": [{"name": "a", "vhost": "nope", "durable": True, "auto_delete": False, "arguments": {}}]},
     "queue 'a': no vhost 'nope'"),
    ({"queues": [{"name": "a", "vhost": "/", "durable": "yes"}]},
     "queue 'a' in vhost '/': 'durable' must be true or false"),
    ({"queues": [{"name": "a", "vhost": "/", "arguments": {"x-max-length": "x"}}]},
     "queue 'a' in vhost '/': PRECONDITION_FAILED - invalid arg 'x-max-length' for queue 'a' in vhost '/'"),
    ({"exchanges": [{"name": "e", "vhost": "/", "type": "nope"}]},
     "exchange 'e' in vhost '/': unknown exchange type 'nope'"),
    ({"policies": [{"vhost": "/", "name": "p", "pattern": "^q", "definition": {"bogus": 1}}]},
     "policy 'p' in vhost '/': "),
    ({"parameters": [{"vhost": "/", "name": "up", "component": "nonesuch", "value": {}}]},
     "parameter 'up' of component 'nonesuch' in vhost '/': unknown parameter component 'nonesuch'"),
    ({"bindings": [{"source": "amq.headers", "vhost": "/", "destination": "amq.direct",
                    "destination_type": "exchange", "arguments": {"x-match": "some"}}]},
     "binding of exchange 'amq.direct' to exchange 'amq.headers' in vhost '/': "),
    ({"bindings": [{"source": "amq.direct", "vhost": "/", "destination": "q", "destination_type": "stream"}]},
     "destination_type must be 'queue' or 'exchange', got 'stream'"),
    ({"vhosts": [{"name": "v" * 256}]}, "name should be less than 255 bytes, actually was 256"),
    ({"queues": [{"name": "q" * 300, "vhost": "/"}]}, "name should be less than 255 bytes, actually was 300"),
    ({"exchanges": [{"name": "é" * 128, "vhost": "/", "type": "direct"}]},
     "name should be less than 255 bytes, actually was 256"),
    ({"bindings": [{"source": "amq.direct", "vhost": "/", "destination": "amq.fanout",
                    "destination_type": "exchange", "routing_key": "k" * 256}]},
     "routing_key should be less than 255 bytes, actually was 256"),
])
def test_a_bad_item_is_refused_by_name_and_nothing_changes(document, reason):
    node = Node()
    node.bootstrap("/", "guest", "guest")
    document = {"vhosts": [{"name": "created-first"}], "users": [{"name": "made-first", "password": "x"}],
                **document}
    with pytest.raises(DefinitionsError) as error:
        import_definitions(node, document)
    assert reason in str(error.value)
    assert set(node.vhosts) == {"/"} and set(node.users) == {"guest"}


def test_existing_queues_and_exchanges_are_kept_and_reserved_or_dangling_items_skipped(caplog):
    node = imported(RABBITMQ_EXPORT)
    with caplog.at_level(logging.WARNING, logger="broker.model.definitions"):
        import_definitions(node, {
            "queues": [{"name": "q1", "vhost": "v1", "durable": True, "arguments": {"x-max-length": 7}},
                       {"name": "amq.q", "vhost": "v1"}],
            "exchanges": [{"name": "amq.mine", "vhost": "v1", "type": "direct"}],
            "bindings": [{"source": "amq.direct", "vhost": "v1", "destination": "gone", "destination_type": "queue",
                          "routing_key": "z", "arguments": {}}]})
    vhost = node.vhosts["v1"]
    assert vhost.queues["q1"].arguments == {"x-max-length": 5}
    assert "amq.q" not in vhost.queues and "amq.mine" not in vhost.exchanges
    warnings = "\n".join(record.getMessage() for record in caplog.records)
    assert "keeping the existing queue 'q1' in vhost 'v1', which differs" in warnings
    assert "skipping queue 'amq.q' in vhost 'v1': the name is reserved" in warnings
    assert "skipping binding of queue 'gone' to exchange 'amq.direct' in vhost 'v1'" in warnings


def test_a_document_that_is_not_an_object_is_refused():
    with pytest.raises(DefinitionsError, match="must be a JSON object"):
        import_definitions(Node(), [])
