"""The shovel component of a node: a stored definition it cannot run is listed, terminated, saying why."""

from __future__ import annotations

import pytest

from broker.model.node import Node
from broker.shovel.component import COMPONENT, Shovels


def test_a_stored_definition_that_does_not_pass_the_checks_is_listed_terminated_saying_why():
    node = Node()
    node.bootstrap("/", "guest", "guest")
    node.vhosts["/"].parameters[(COMPONENT, "old")] = {"src-uri": "amqp://h", "dest-uri": "amqp://h"}  # (no queue)
    shovels = Shovels(node, "warren", lambda: ("127.0.0.1", 5672))
    shovels.start()
    [entry] = shovels.status()
    assert (entry["name"], entry["vhost"], entry["type"], entry["state"]) == ("old", "/", "dynamic", "terminated")
    assert entry["reason"] == ("failed to parse configuration: Validation failed\n\n"
                               "Must specify 'src-exchange' or 'src-queue'\n")
    node.clear_parameter("/", COMPONENT, "old")
    assert shovels.status() == []


def test_a_uri_of_this_node_names_a_vhost_the_user_setting_the_shovel_may_use():
    """As RabbitMQ's check of a direct URI: the shovel connects to this node over loopback (as guest by default,
    whom a remote user could not log in as), so it may reach no vhost its definer cannot."""
    node = Node()
    node.bootstrap("/", "guest", "guest")
    node.add_vhost("other")
    node.put_user("alice", "secret", tags=["policymaker"])
    node.set_permissions("alice", "/", ".*", ".*", ".*")
    Shovels(node, "warren", lambda: ("127.0.0.1", 5672))
    value = {"src-uri": "amqp:///other", "src-queue": "q", "dest-uri": "amqp://", "dest-queue": "q"}
    with pytest.raises(ValueError, match='user "alice" may not connect to vhost "other"'):
        node.set_parameter("/", COMPONENT, "s", value, "alice")
    with pytest.raises(ValueError, match='user "alice" may not connect to vhost "gone"'):
        node.set_parameter("/", COMPONENT, "s", {**value, "src-uri": "amqp:///gone"}, "alice")
    node.set_permissions("alice", "other", "", "", ".*")
    assert node.set_parameter("/", COMPONENT, "s", value, "alice")
    assert node.set_parameter("/", COMPONENT, "t", {**value, "src-uri": "amqp:///gone"})  # (an import: unchecked)
