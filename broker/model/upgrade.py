"""The store keys of a data dir written by an earlier version, rewritten at its first start.

Earlier versions made a queue's or an exchange's store key of its vhost's name and its own joined by "|", and a
policy's, a permission's and a binding's of their names joined by NUL (a bare name before that, for exchanges), so
names holding those characters could give two objects one key: vhost "a" with queue "b|c" and vhost "a|b" with queue
"c" shared "a|b|c", its messages and its definition record. Keys are made by broker.model.keys now. At start,
before anything is restored, each definition record found under another name than the key its data (its vhost and
names, kept as fields of their own) makes moves to that key, with what the store holds under the old one: a queue's
or a delayed exchange's messages are written again under the new key (fresh ids, in segments written and fsynced
before the old key goes), a stream's log is renamed. A record written by this version is under its key: a later
start moves nothing, and finds that in one look at each record's name.

Messages that two objects may have shared cannot be told apart: when another vhost of this node could own the old
key too, they go to neither. They are set aside in ``data_dir/quarantine/`` (storage.store.MessageStore.set_aside),
with an ERROR that names the key, the vhosts and where they went, and the object recorded last is restored without
them. So is what an old key holds that another record's new key is (names written with escapes), so that the key is
free before anything goes there.

A start cut short leaves each record under its old key, its new one, or both (the new record is written first): the
next start moves what is left, and where both are, the new one (whose messages were durable before it was written)
stands and the old one goes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from broker.model.arguments.exchange import DELAYED_TYPE
from broker.model.exchange import canonical_arguments
from broker.model.keys import (
    DELAYED_PREFIX, SEPARATOR, binding_key, delayed_key, exchange_key, permission_key, policy_key, queue_key,
)

if TYPE_CHECKING:
    from broker.model.node import Node
    from storage.recovery import Recovered
    from storage.store import MessageStore

log = logging.getLogger(__name__)

# the fields of a stored definition that name it, in its key's order (a binding's key ends with its arguments')
NAMES = {"queue": ("vhost", "name"), "exchange": ("vhost", "name"), "policy": ("vhost", "name"),
         "operator_policy": ("vhost", "name"), "permission": ("vhost", "user"),
         "binding": ("vhost", "source", "destination_kind", "destination", "routing_key")}
KEYS = {"queue": queue_key, "exchange": exchange_key, "policy": policy_key, "operator_policy": policy_key,
        "permission": permission_key}  # kind -> its key, of the names above (a binding's: binding_key)


@dataclass
class Move:
    """A definition record found under another name than the key its data makes."""

    kind: str
    old: str  # the record's name: the key an earlier version made
    new: str  # the key its data makes
    data: dict
    held: str = ""  # the key the store holds its messages or stream log under ("" for a definition alone)
    holds: str = ""  # the key they move to
    settled: bool = False  # a record under the new key exists already (this version's): the old one only goes


def definition_key(kind: str, data: dict) -> str | None:
    """The key a stored definition of kind is recorded under, made of the names its data holds; None if a name is
    missing or not text (the record is left as it is, and restoring it says why)."""
    fields = NAMES.get(kind)
    if fields is None:
        return None
    names: list[Any] = [data.get(field) for field in fields]
    if not all(isinstance(name, str) for name in names):
        return None
    if kind != "binding":
        return KEYS[kind](*names)
    arguments = data.get("arguments")
    if not isinstance(arguments, dict):
        return None
    vhost, source, destination_kind, destination, routing_key = names
    return binding_key(vhost, source, destination_kind, destination, routing_key, canonical_arguments(arguments))


def held_key(kind: str, name: str, data: dict) -> str:
    """The key the store holds the messages (or the stream log) of a definition recorded under name: a queue's is
    its record's name; a delayed exchange's is made of its vhost's and its own names, joined by "|" as they were
    (whatever its record's name) by the versions before keys.composite_key, else as delayed_key makes it. "" for
    other definitions."""
    if kind == "queue":
        return name
    vhost, exchange = data.get("vhost"), data.get("name")
    if kind != "exchange" or data.get("type") != DELAYED_TYPE or not isinstance(vhost, str) \
            or not isinstance(exchange, str):
        return ""
    if name == exchange_key(vhost, exchange):
        return delayed_key(vhost, exchange)
    return f"{DELAYED_PREFIX}{vhost}{SEPARATOR}{exchange}"


def upgrade(node: "Node", recovered: "Recovered") -> None:
    """Move every definition record of node's store that is not under its key, with what the store holds under
    its old key (see the module's text). Raises OSError if the store cannot write the copies or keep what is set
    aside."""
    store = node.store
    if store is None:
        return
    moves = _moves(store)
    if not moves:
        return
    for move in moves:
        if move.held:
            _clear(store, recovered, move, moves, node.vhosts)
    _copy(store, recovered, moves)
    # A key grows when it moves: a record whose old key is another's new one (names with escapes) goes first, and
    # of two records of one object (an exchange's under its bare name and under vhost|name), the later version's.
    written: set[tuple[str, str]] = set()
    for move in sorted(moves, key=lambda move: len(move.old), reverse=True):
        _record(store, move, (move.kind, move.new) in written)
        written.add((move.kind, move.new))
    log.info("rewrote the store keys of %d definitions of an earlier version's data dir", len(moves))


def _moves(store: "MessageStore") -> list[Move]:
    """The records to move: each under another name than its key, with where what it holds goes."""
    records = store.definitions()
    moves = []
    for kind, name, data in records:
        if not _maybe_moved(kind, name):
            continue
        key = definition_key(kind, data)
        if key is not None and key != name:
            moves.append(Move(kind, name, key, data))
    names = {(kind, name) for kind, name, _ in records}
    moving = {(move.kind, move.old) for move in moves}
    for move in moves:
        held, holds = held_key(move.kind, move.old, move.data), held_key(move.kind, move.new, move.data)
        if held != holds:
            move.held, move.holds = held, holds
        move.settled = (move.kind, move.new) in names and (move.kind, move.new) not in moving
    return moves


def _clear(store: "MessageStore", recovered: "Recovered", move: Move, moves: list[Move], vhosts) -> None:
    """Before anything is copied: move's old key goes at once where it holds nothing to copy, what it holds is
    set aside where nobody can tell whose it is, and is left alone where an earlier start set it aside and another
    definition's key it is now holds that one's."""
    if any(other.settled and other.holds == move.held for other in moves):
        move.held = ""
    elif move.settled:
        recovered.messages.pop(move.held, None)
        store.delete_queue(move.held)  # its messages were copied by the start that wrote its new record
        move.held = ""
    else:
        others = _owners(move.held, vhosts) - {(move.kind, move.data["vhost"], move.data["name"])}
        if others or any(other.holds == move.held for other in moves):
            _set_aside(store, recovered, move, others)


def _maybe_moved(kind: str, name: str) -> bool:
    """Whether a record's name may be an earlier version's key (a cheap look, true for every one of them): such a
    key of several names holds a NUL; a queue's, no "|" or several, or a character this version escapes; an
    exchange's may be its bare name, which may hold one "|" (exchanges are few: each is looked at). One this
    version made never holds a NUL."""
    if kind == "exchange":
        return True
    if kind == "queue":
        return name.count(SEPARATOR) != 1 or "\\" in name or "\x00" in name
    return "\x00" in name


def _owners(key: str, vhosts) -> set[tuple[str, str, str]]:
    """Whose messages an earlier version's key may hold: (kind, vhost, name) of each way to read it as a queue's
    or a delayed exchange's key with a vhost that exists."""
    owners = {("queue", vhost, name) for vhost, name in _splits(key) if vhost in vhosts}
    if key.startswith(DELAYED_PREFIX):
        owners |= {("exchange", vhost, name) for vhost, name in _splits(key[len(DELAYED_PREFIX):])
                   if vhost in vhosts}
    return owners


def _splits(key: str) -> list[tuple[str, str]]:
    """Each (vhost, name) whose names joined by "|" make key."""
    return [(key[:at], key[at + 1:]) for at, char in enumerate(key) if char == SEPARATOR]


def _set_aside(store: "MessageStore", recovered: "Recovered", move: Move, others: set[tuple[str, str, str]]) -> None:
    """What move's old key holds goes to quarantine (its record goes with the others, once the new one is
    written)."""
    held, move.held = move.held, ""
    kept = store.set_aside(held, recovered.messages.pop(held, None))
    if not kept:
        return
    if others:
        reason = "vhost " + " or ".join(sorted(repr(vhost) for _, vhost, _ in others)) + " could own it too"
    else:
        reason = "it is another definition's key now"
    log.error("%s %r of vhost %r: what an earlier version kept for it under the key %r cannot be told apart from "
              "another's (%s): set aside in %s, and restored without it", move.kind, move.data["name"],
              move.data["vhost"], held, reason, ", ".join(str(path) for path in kept))


def _copy(store: "MessageStore", recovered: "Recovered", moves: list[Move]) -> None:
    """What the old keys of moves hold, under their new keys: messages written again, a stream's log renamed;
    whatever a new key holds without a record first goes (a start cut short left it)."""
    copying = []
    for move in moves:
        if not move.holds or move.settled:
            continue
        if recovered.messages.pop(move.holds, None) is not None:
            store.delete_queue(move.holds)
        if move.held:
            stored = recovered.messages.pop(move.held, None)
            if stored:
                copying.append((stored, move.holds))
            store.streams.rename(move.held, move.holds)
    copies = store.copy_messages(copying, recovered.next_msg_id) if copying else []
    for copy in copies:
        recovered.messages[copy.queue] = copy
    recovered.next_msg_id += sum(len(copy) for copy in copies)


def _record(store: "MessageStore", move: Move, written: bool) -> None:
    """move's definition under its new key (unless one is there already, or was just written), then its old key
    gone."""
    if not move.settled and not written:
        store.append_definition(move.kind, move.new, move.data)
    if move.held:
        store.delete_queue(move.held)  # the old key's messages (and a queue's record)
    if move.kind != "queue" or not move.held:
        store.append_definition(move.kind, move.old, None)
