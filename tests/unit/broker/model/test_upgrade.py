"""A data dir an earlier version wrote, whose keys joined names as they were ("|" for queues and exchanges, NUL for
policies, permissions and bindings), starts with each record moved to its key (broker.model.upgrade), what the
store held under the old key with it, in order; the next start moves nothing. Messages two tenants may have shared
under one old key go to nobody: they are set aside in quarantine/. A start cut short is finished by the next."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Callable, TypeVar

from broker.model.access import DEFAULT_HASHING, Permission, User, hash_password
from broker.model.keys import binding_key, exchange_key, permission_key, policy_key, queue_key
from broker.model.node import Node
from broker.model.vhost import VirtualHost
from storage.store import MessageStore
from tests.unit.broker.model.node_support import on_node
from tests.unit.storage.storage_support import run

T = TypeVar("T")
KINDS = ("queue", "exchange", "policy", "binding", "permission")  # the kinds of records keyed by several names
LATER = str(2 ** 41)  # a delayed message's due time (ms since the epoch) that a test never reaches


def header(body: bytes) -> bytes:
    """A persistent message's content header payload (no other property)."""
    return b"\x00\x3c\x00\x00" + len(body).to_bytes(8, "big") + b"\x10\x00\x02"


def vhost(name: str) -> tuple[str, str, dict]:
    return "vhost", name, VirtualHost(name, None, None).definition()


def queue(vhost_name: str, name: str, **arguments) -> tuple[str, str, dict]:
    """A durable queue recorded under an earlier version's key."""
    return "queue", f"{vhost_name}|{name}", {"vhost": vhost_name, "name": name, "durable": True,
                                             "auto_delete": False, "arguments": arguments}


def delayed_exchange(vhost_name: str, name: str) -> tuple[str, str, dict]:
    return "exchange", f"{vhost_name}|{name}", {
        "vhost": vhost_name, "name": name, "type": "x-delayed-message", "durable": True, "auto_delete": False,
        "internal": False, "arguments": {"x-delayed-type": "direct"}}


def earlier(data_dir: Path, definitions: list[tuple[str, str, dict]],
            messages: list[tuple[str, bytes, bool]] = ()) -> None:
    """Write these records (kind, name, data) and messages (store key, body, delivered before the stop) as they
    are, with user guest."""
    guest = User("guest", hash_password("guest"), DEFAULT_HASHING, ["administrator"])

    def work(store: MessageStore) -> None:
        store.append_definition("user", "guest", guest.definition())
        for kind, name, data in definitions:
            store.append_definition(kind, name, data)
        for msg_id, (key, body, delivered) in enumerate(messages, 1):
            exchange = LATER if key.startswith("\x00") else ""
            store.append_message(msg_id, (key,), exchange, "rk", header(body), body)
            if delivered:
                store.append_delivered(key, [msg_id])
    run(data_dir, work)


def started(data_dir: Path, look: Callable[[Node], T]) -> T:
    """Start on data_dir as the broker does, look at the node, then stop once everything is durable."""
    async def scenario(node: Node) -> T:
        return look(node)
    return on_node(data_dir, scenario)


def queued(node: Node, vhost_name: str, name: str) -> list[tuple[bytes, bool]]:
    return [(entry.message.body, entry.redelivered) for entry in node.vhosts[vhost_name].queues[name].entries]


def records(node: Node, *kinds: str) -> set[tuple[str, str]]:
    return {(kind, name) for kind, name, _ in node.store.definitions() if kind in kinds}


def test_every_record_moves_to_its_key_with_what_its_old_key_held(tmp_path, caplog):
    policy = {"vhost": "p|q", "name": "cap", "pattern": "^r", "apply-to": "queues", "definition": {"max-length": 9},
              "priority": 0}
    binding = {"vhost": "p|q", "source": "later", "destination": "r", "destination_kind": "queue",
               "routing_key": "a\x00b", "arguments": {}}
    earlier(tmp_path, [
        vhost("/"), vhost("p|q"), queue("p|q", "r"), queue("/", "s|t"), queue("/", "plain"),
        delayed_exchange("p|q", "later"),
        ("exchange", "bare", {"vhost": "/", "name": "bare", "type": "fanout", "durable": True, "auto_delete": False,
                              "internal": False, "arguments": {}}),  # keyed by its name alone, before "|" keys
        ("exchange", "x|y", {"vhost": "/", "name": "x|y", "type": "fanout", "durable": True, "auto_delete": False,
                             "internal": False, "arguments": {}}),  # the same, its name holding one "|"
        ("policy", "p|q\x00cap", policy),
        ("binding", "\x00".join(("p|q", "later", "queue", "r", "a\x00b", "")), binding),
        ("permission", "p|q\x00guest", Permission("guest", "p|q", ".*", ".*", ".*").definition()),
    ], [("p|q|r", b"r-1", True), ("/|s|t", b"st-1", False), ("p|q|r", b"r-2", False), ("/|plain", b"plain", False),
        ("\x00delayed|p|q|later", b"waiting", False)])

    def look(node: Node):
        return ({name: queued(node, vhost_name, name) for vhost_name, name in (("p|q", "r"), ("/", "s|t"),
                                                                                ("/", "plain"))},
                len(node.vhosts["p|q"].exchanges["later"].delayed), node.vhosts["p|q"].queues["r"].policy.name,
                [b.routing_key for b in node.vhosts["p|q"].queues["r"].bindings], records(node, *KINDS))
    with caplog.at_level(logging.INFO, logger="broker.model.upgrade"):
        messages, waiting, policy_name, routing_keys, names = started(tmp_path, look)
    expected = {"r": [(b"r-1", True), (b"r-2", False)], "s|t": [(b"st-1", False)], "plain": [(b"plain", False)]}
    assert messages == expected
    assert (waiting, policy_name, routing_keys) == (1, "cap", ["a\x00b"])
    assert names == {
        ("queue", queue_key("p|q", "r")), ("queue", queue_key("/", "s|t")), ("queue", "/|plain"),
        ("exchange", exchange_key("p|q", "later")), ("exchange", "/|bare"), ("exchange", exchange_key("/", "x|y")),
        ("policy", policy_key("p|q", "cap")),
        ("binding", binding_key("p|q", "later", "queue", "r", "a\x00b", "")),
        ("permission", permission_key("p|q", "guest")),
    }
    assert ["rewrote the store keys of 8 definitions" in record.getMessage() for record in caplog.records] == [True]

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="broker.model.upgrade"):
        again = started(tmp_path, look)
    assert again == (expected, 1, "cap", ["a\x00b"], names)
    assert not caplog.records  # nothing left to move


def test_messages_two_vhosts_may_have_shared_under_one_old_key_go_to_nobody(tmp_path, caplog):
    """Vhosts "a" and "a|b" both exist: "a|b|c" may have held "a"'s queue "b|c" as well as the queue "c" of
    "a|b" recorded there last."""
    earlier(tmp_path, [vhost("a"), vhost("a|b"), queue("a|b", "c")],
            [("a|b|c", b"for a", False), ("a|b|c", b"for a|b", False)])
    with caplog.at_level(logging.ERROR, logger="broker.model.upgrade"):
        messages, names = started(tmp_path, lambda node: (queued(node, "a|b", "c"), records(node, "queue")))
    assert (messages, names) == ([], {("queue", queue_key("a|b", "c"))})
    [kept] = (tmp_path / "quarantine").iterdir()
    assert kept.read_bytes().count(b"for a") == 2
    [error] = [record.getMessage() for record in caplog.records]
    assert "'a|b|c'" in error and "vhost 'a' could own it too" in error and str(kept) in error
    assert started(tmp_path, lambda node: queued(node, "a|b", "c")) == []
    assert len(list((tmp_path / "quarantine").iterdir())) == 1  # set aside once


def test_what_an_old_key_holds_that_another_records_new_key_is_goes_aside_first(tmp_path, caplog):
    """Queue "b|c" of vhost "a\\" was under "a\\|b|c", the key of queue "c" of vhost "a|b" now: what that key held
    is set aside before the other's messages move there."""
    earlier(tmp_path, [vhost("a\\"), vhost("a|b"), queue("a\\", "b|c"), queue("a|b", "c")],
            [("a\\|b|c", b"of a\\", False), ("a|b|c", b"of a|b", False)])
    assert queue_key("a|b", "c") == "a\\|b|c"
    with caplog.at_level(logging.ERROR, logger="broker.model.upgrade"):
        seen = started(tmp_path, lambda node: (queued(node, "a\\", "b|c"), queued(node, "a|b", "c")))
    assert seen == ([], [(b"of a|b", False)])
    assert "it is another definition's key now" in caplog.records[0].getMessage()
    assert started(tmp_path, lambda node: (queued(node, "a\\", "b|c"), queued(node, "a|b", "c"))) == seen


def test_a_start_cut_short_after_the_new_record_keeps_what_the_new_key_holds(tmp_path):
    """The new record is written once its messages are durable: where old and new records both are, the new key
    holds the queue's messages (r-1 was acked and r-3 published since the copy), and the old key's go."""
    old = queue("p|q", "r")
    earlier(tmp_path, [vhost("p|q"), old, ("queue", queue_key("p|q", "r"), old[2])],
            [("p|q|r", b"r-1", False), ("p|q|r", b"r-2", False), (queue_key("p|q", "r"), b"r-2", False),
             (queue_key("p|q", "r"), b"r-3", False)])
    for _ in range(2):
        messages, names = started(tmp_path, lambda node: (queued(node, "p|q", "r"), records(node, "queue")))
        assert (messages, names) == ([(b"r-2", False), (b"r-3", False)], {("queue", queue_key("p|q", "r"))})


def test_a_start_cut_short_before_the_new_record_copies_again(tmp_path):
    """Copies under the new key with no record there are a start's that was cut short: they go, and the old key's
    messages are copied again."""
    earlier(tmp_path, [vhost("p|q"), queue("p|q", "r")],
            [("p|q|r", b"r-1", False), ("p|q|r", b"r-2", False), (queue_key("p|q", "r"), b"r-1", False)])
    for _ in range(2):
        assert started(tmp_path, lambda node: queued(node, "p|q", "r")) == [(b"r-1", False), (b"r-2", False)]


def test_a_streams_log_moves_to_its_new_key(tmp_path):
    earlier(tmp_path, [vhost("p|q"), queue("p|q", "s", **{"x-queue-type": "stream"})])

    def work(store: MessageStore) -> None:
        log = store.streams.open("p|q|s", 1 << 20, None, None, True)
        for body in (b"s-1", b"s-2"):
            log.append("", "s", header(body), body)
    run(tmp_path, work)
    for _ in range(2):
        assert started(tmp_path, lambda node: node.vhosts["p|q"].queues["s"].log.next_offset) == 2
    assert [path.name for path in (tmp_path / "streams").iterdir()] == [hashlib.sha256(b"p\\|q|s").hexdigest()[:32]]
