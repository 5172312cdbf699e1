"""The shovel component of a node: a stored definition it cannot run is listed, terminated, saying why."""

from __future__ import annotations

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
