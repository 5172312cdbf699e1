"""Restoring a virtual host from stored definitions never fails start-up: a definition that cannot be used is logged
with one ERROR line naming it and skipped, and everything else is restored."""

from __future__ import annotations

import asyncio
import logging

import pytest

from broker.model.durability import restore
from broker.model.keys import queue_key
from broker.model.node import Node
from broker.model.vhost import VirtualHost
from storage.recovered_messages import StoredMessage
from storage.recovery import Recovered


class FakeStore:
    """The part of the store restore() uses: what it was asked to delete, the definitions it holds and rewrites."""

    def __init__(self, records: dict | None = None) -> None:
        self.deleted_queues: list[str] = []
        self.records: dict[tuple[str, str], dict] = records or {}  # (kind, name) -> data, live ones

    def delete_queue(self, key: str) -> None:
        self.deleted_queues.append(key)

    def definitions(self) -> list[tuple[str, str, dict]]:
        return [(kind, name, data) for (kind, name), data in self.records.items()]

    def append_definition(self, kind: str, name: str, data: dict | None) -> None:
        if data is None:
            self.records.pop((kind, name), None)
        else:
            self.records[kind, name] = data


def exchange(name: str, **changes) -> dict:
    return {"vhost": "/", "name": name, "type": "direct", "durable": True, "auto_delete": False, "internal": False,
            "arguments": {}, **changes}


def queue(name: str, **changes) -> dict:
    return {"vhost": "/", "name": name, "durable": True, "auto_delete": False, "arguments": {}, **changes}


def binding(source: str, destination: str, **changes) -> dict:
    return {"vhost": "/", "source": source, "destination": destination, "destination_kind": "queue",
            "routing_key": destination, "arguments": {}, **changes}


class StoredList(list):
    """Recovered messages as restore() reads those of a queue that keeps them all in memory
    (storage.recovered_messages.RecoveredMessages), from a list."""

    def read(self, start: int, stop: int) -> list[StoredMessage]:
        return self[start:stop]


def one_message(msg_id: int, body: bytes) -> StoredList:
    header = b"\x00\x3c\x00\x00" + len(body).to_bytes(8, "big") + b"\x00\x00"
    return StoredList([StoredMessage(msg_id, "", "q", header, body, False)])


def recovered(exchanges=(), queues=(), bindings=(), messages=None) -> Recovered:
    return Recovered(list(exchanges), list(queues), list(bindings), messages or {}, 10, {})


def restored(data: Recovered, store: FakeStore | None = None) -> tuple[VirtualHost, FakeStore]:
    async def run() -> tuple[VirtualHost, FakeStore]:
        nonlocal store
        store = store or FakeStore()
        node = Node(store)
        vhost = node.vhosts["/"] = VirtualHost("/", store, node)
        restore(node, data)
        return vhost, store
    return asyncio.run(run())


BAD_EXCHANGES = {
    "missing-type": {key: value for key, value in exchange("x-bad").items() if key != "type"},
    "no-arguments-key": {key: value for key, value in exchange("x-bad").items() if key != "arguments"},
    "unknown-type": exchange("x-bad", type="x-consistent-hash"),
    "name-not-a-string": exchange(42),
    "arguments-not-a-table": exchange("x-bad", arguments=[1, 2]),
    "bad-alternate-exchange": exchange("x-bad", arguments={"alternate-exchange": 5}),
}

BAD_QUEUES = {
    "missing-name": {key: value for key, value in queue("q-bad").items() if key != "name"},
    "auto-delete-not-a-bool": queue("q-bad", auto_delete="yes"),
    "argument-no-longer-valid": queue("q-bad", arguments={"x-max-length": -1}),
    "unknown-queue-type": queue("q-bad", arguments={"x-queue-type": "stream-of-consciousness"}),
    "arguments-not-a-table": queue("q-bad", arguments="x-max-length=1"),
    "not-a-table": ["q-bad"],
}

BAD_BINDINGS = {
    "source-gone": binding("x-gone", "q"),
    "destination-gone": binding("x", "q-gone"),
    "unknown-destination-kind": binding("x", "q", destination_kind="topic"),
    "routing-key-not-a-string": binding("x", "q", routing_key=7),
    "missing-arguments": {key: value for key, value in binding("x", "q").items() if key != "arguments"},
    "bad-x-match": binding("x", "q", arguments={"x-match": "some"}) | {"source": "h"},
}


@pytest.mark.parametrize("bad", BAD_EXCHANGES.values(), ids=BAD_EXCHANGES.keys())
def test_an_unusable_exchange_is_skipped_and_the_rest_restored(bad, caplog):
    with caplog.at_level(logging.ERROR, logger="broker.model.durability"):
        vhost, _ = restored(recovered([exchange("x"), bad, exchange("x2")], [queue("q")], [binding("x", "q")]))
    assert {"x", "x2"} <= set(vhost.exchanges)
    assert "x-bad" not in vhost.exchanges
    assert "q" in vhost.queues and len(vhost.queues["q"].bindings) == 1
    assert _one_error_line(caplog).startswith("skipping stored exchange")


@pytest.mark.parametrize("bad", BAD_QUEUES.values(), ids=BAD_QUEUES.keys())
def test_an_unusable_queue_is_skipped_and_the_rest_restored(bad, caplog):
    with caplog.at_level(logging.ERROR, logger="broker.model.durability"):
        vhost, _ = restored(recovered([exchange("x")], [queue("q"), bad, queue("q2")], [binding("x", "q")]))
    assert set(vhost.queues) == {"q", "q2"}
    assert len(vhost.queues["q"].bindings) == 1
    assert _one_error_line(caplog).startswith("skipping stored queue")


@pytest.mark.parametrize("bad", BAD_BINDINGS.values(), ids=BAD_BINDINGS.keys())
def test_an_unusable_binding_is_skipped_and_the_rest_restored(bad, caplog):
    exchanges = [exchange("x"), exchange("h", type="headers")]
    with caplog.at_level(logging.ERROR, logger="broker.model.durability"):
        vhost, _ = restored(recovered(exchanges, [queue("q"), queue("q2")], [bad, binding("x", "q2")]))
    assert [b.routing_key for b in vhost.queues["q2"].bindings] == ["q2"]
    assert not vhost.queues["q"].bindings
    assert _one_error_line(caplog).startswith("skipping stored binding")


def test_the_messages_of_a_skipped_queue_are_kept_on_disk_and_the_others_restored(caplog):
    messages = {queue_key("/", "q-bad"): one_message(1, b"kept"), queue_key("/", "q"): one_message(2, b"restored"),
                queue_key("/", "q-deleted"): one_message(3, b"orphan")}
    with caplog.at_level(logging.ERROR, logger="broker.model.durability"):
        vhost, store = restored(recovered([], [queue("q"), queue("q-bad", arguments={"x-max-length": "ten"})],
                                          messages=messages))
    assert [entry.message.body for entry in vhost.queues["q"].entries] == [b"restored"]
    assert store.deleted_queues == [queue_key("/", "q-deleted")]  # only the queue whose definition is gone
    assert "q-bad" in _one_error_line(caplog)


def test_the_messages_of_a_queue_whose_definition_was_set_aside_are_kept_on_disk():
    data = recovered([], [queue("q")], messages={queue_key("/", "q-undecodable"): one_message(1, b"kept"),
                                                 queue_key("/", "q-deleted"): one_message(2, b"orphan")})
    data.set_aside_definitions = [("queue", queue_key("/", "q-undecodable"))]
    _, store = restored(data)
    assert store.deleted_queues == [queue_key("/", "q-deleted")]


def test_no_stored_messages_are_deleted_when_the_definitions_log_was_damaged(caplog):
    data = recovered([], [queue("q")], messages={queue_key("/", "q-lost"): one_message(1, b"kept")})
    data.report = {"definitions_damaged": True}
    with caplog.at_level(logging.ERROR, logger="broker.model.durability"):
        _, store = restored(data)
    assert store.deleted_queues == []
    assert "q-lost" in _one_error_line(caplog)


def _one_error_line(caplog) -> str:
    errors = [record for record in caplog.records if record.levelno >= logging.ERROR]
    assert len(errors) == 1, [record.getMessage() for record in errors]
    assert errors[0].exc_info is None  # a line, not a traceback
    message = errors[0].getMessage()
    assert "\n" not in message
    return message


def test_an_exchange_recorded_under_its_bare_name_moves_to_its_vhosts_key():
    """Earlier data dirs keyed exchange definitions by name alone, shared by two vhosts' exchanges of that name."""
    legacy = exchange("ex")
    _, store = restored(recovered(exchanges=[legacy]), FakeStore({("exchange", "ex"): legacy}))
    assert store.records == {("exchange", "/|ex"): legacy}


def test_an_exchange_under_its_vhosts_key_is_left_as_it_is():
    current = exchange("ex")
    _, store = restored(recovered(exchanges=[current]), FakeStore({("exchange", "/|ex"): current}))
    assert store.records == {("exchange", "/|ex"): current}
