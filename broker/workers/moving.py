"""Moving a vhost, or one durable queue, from one worker's store to another's, while the workers involved are stopped.

A vhost: its durable definitions
(exchanges, queues, bindings, policies, operator policies, runtime parameters), the messages stored for its
durable queues and delayed exchanges (each with its redelivered flag, in queue order) and its streams' logs. What
a restart of the vhost would not keep (non-durable queues and exchanges, non-persistent messages) is not moved.

A journal makes it safe to stop at any point: data_dir/workers/moving.json (``{"vhost", "from", "to"}``) is written
before anything is copied and removed once the source no longer holds the vhost. A start that finds it finishes the
move (``finish``): while the placement still names the source, whatever an earlier try copied to the target is
removed and the copy is made again, then the placement names the target; once it does, the source's copy is
removed. So the vhost is whole in the store the placement names at every moment.

A queue (``move_queue``): its definition and its stored messages (with their redelivered flags, in queue order). The
record that names its owner is its vhost's worker's (the home's): ``{"owner": k}`` in its definition there, or none
when the home owns it. The journal (``{"vhost", "queue", "home", "from", "to"}``) is finished the same way, the
home's record in the placement's part: while it names the source, the copy is made again; once it names the target,
the source's copy is removed. Only a durable queue moves (a restart of its workers is what a move is), and not a
stream (a stream stays on its vhost's worker).

What moves keeps its names and keys as the source has them (broker.model.upgrade.held_key): a store an earlier
version wrote goes as it is, and the target's start rewrites its keys.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Callable, Iterator

from broker.model.keys import queue_key
from broker.model.upgrade import held_key
from broker.workers.placement import worker_data_dir, workers_directory
from storage.segments import fsync_directory, write_durably
from storage.recovery import Recovered
from storage.store import MessageStore

log = logging.getLogger(__name__)

JOURNAL = "moving.json"
KINDS = ("exchange", "queue", "binding", "policy", "operator_policy", "parameter")  # a vhost's own definitions
SLICE = 1000  # messages read and appended at a time: a deep queue is moved in bounded memory


class MoveError(Exception):
    """The move could not be made (a store that cannot be opened or written): nothing the placement names changed."""


def journal_path(data_dir: Path) -> Path:
    return workers_directory(data_dir) / JOURNAL


def pending(data_dir: Path) -> dict | None:
    """The move a stop interrupted, if any: {"vhost", "from", "to"}, and "queue" and "home" for a queue's."""
    try:
        move = json.loads(journal_path(data_dir).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except ValueError as error:
        raise MoveError(f"cannot read {journal_path(data_dir)}: {error}") from None
    if not (isinstance(move, dict) and isinstance(move.get("vhost"), str)
            and all(type(move.get(end)) is int for end in ("from", "to"))
            and ("queue" not in move or (isinstance(move["queue"], str) and type(move.get("home")) is int))):
        raise MoveError(f"{journal_path(data_dir)} is not a move ({{\"vhost\", \"from\", \"to\"}}, and \"queue\" "
                        "and \"home\" for a queue's)")
    return move


def move(data_dir: Path, vhost: str, source: int, target: int, leader: Callable[[], int],
         lead: Callable[[], None]) -> None:
    """Move vhost from worker source's store to target's (both stopped), on this thread. ``leader()``: the worker the
    placement names for it now; ``lead()`` makes the placement name target, durably."""
    journal = journal_path(data_dir)
    write_durably(journal, json.dumps({"vhost": vhost, "from": source, "to": target}))
    finish(data_dir, leader, lead)


def finish(data_dir: Path, leader: Callable[[], int], lead: Callable[[], None]) -> None:
    """Finish the move the journal names (see the module's text; leader and lead are a vhost's)."""
    move = pending(data_dir)
    if move is None:
        return
    if "queue" in move:
        _finish_queue(data_dir, move)
        return
    vhost, source, target = move["vhost"], move["from"], move["to"]
    if leader() == source:
        log.info("moving vhost '%s' from worker %d to worker %d", vhost, source, target)
        try:
            asyncio.run(_copy(worker_data_dir(data_dir, source), worker_data_dir(data_dir, target), vhost))
        except (MoveError, OSError) as error:  # given up: what was copied goes, the vhost stays where it was
            asyncio.run(_remove_from(worker_data_dir(data_dir, target), vhost))
            _forget(data_dir)
            raise MoveError(f"vhost '{vhost}' stays on worker {source}: {error}") from error
        lead()
    asyncio.run(_remove_from(worker_data_dir(data_dir, source), vhost))
    _forget(data_dir)
    log.info("vhost '%s' moved from worker %d to worker %d", vhost, source, target)


def _forget(data_dir: Path) -> None:
    journal_path(data_dir).unlink()
    fsync_directory(journal_path(data_dir).parent)


@contextmanager
def _opened(data_dir: Path) -> Iterator[tuple[MessageStore, Recovered]]:
    """data_dir's store, read, for a with block that closes it (one that cannot be read holds nothing to close:
    recover() unlocks it, and no writer thread has started)."""
    store = MessageStore(data_dir)
    try:
        recovered = store.recover()
    except Exception as error:
        raise MoveError(f"cannot read the store {data_dir}: {error}") from error
    with closing(store):
        yield store, recovered


def owned(store: MessageStore, vhost: str) -> list[tuple[str, str, dict]]:
    """The vhost's own definitions in store: (kind, name, data)."""
    return [(kind, name, data) for kind, name, data in store.definitions()
            if kind in KINDS and data.get("vhost") == vhost]


async def durable(store: MessageStore, what: str) -> None:
    done = asyncio.get_running_loop().create_future()
    store.when_durable(done.set_result)
    if not await done:
        raise MoveError(f"cannot write {what}: the store's disk refused it (see the log)")


async def _remove(store: MessageStore, vhost: str) -> None:
    """The vhost's definitions and messages leave store; its streams' directories go at the next start (no stream
    owns them then: storage.streams.remove_orphans)."""
    for kind, name, data in owned(store, vhost):
        key = held_key(kind, name, data)
        if key:
            store.delete_queue(key)  # (its messages, and the definition of that name if it is a queue's)
        if kind != "queue":
            store.append_definition(kind, name, None)
    await durable(store, f"the removal of vhost '{vhost}'")


async def _remove_from(data_dir: Path, vhost: str) -> None:
    with _opened(data_dir) as (store, _):
        await _remove(store, vhost)


async def _copy(source_dir: Path, target_dir: Path, vhost: str) -> None:
    with _opened(source_dir) as (source, from_source), _opened(target_dir) as (target, in_target):
        await _remove(target, vhost)  # what an interrupted try left there
        definitions = owned(source, vhost)
        for kind, name, data in definitions:
            target.append_definition(kind, name, data)
        next_id = max(in_target.next_msg_id, 1)
        for kind, name, data in definitions:
            key = held_key(kind, name, data)
            if key:
                next_id = await _copy_messages(target, key, from_source.messages.get(key), next_id)
        await durable(target, f"vhost '{vhost}' in {target_dir}")
        for kind, name, _ in definitions:  # the streams' logs, by their queues' keys
            if kind == "queue" and source.streams.path_of(name).exists():
                _copy_durably(source.streams.path_of(name), target.streams.path_of(name))


async def _copy_messages(target: MessageStore, key: str, stored, next_id: int) -> int:
    """Append one queue's (or delayed exchange's) stored messages to target, in order, under fresh ids."""
    if stored is None:
        return next_id
    for start in range(0, len(stored), SLICE):
        delivered = []
        for message in stored.read(start, min(start + SLICE, len(stored))):
            target.append_message(next_id, (key,), message.exchange, message.routing_key, message.header_payload,
                                  message.body)
            if message.redelivered:
                delivered.append(next_id)
            next_id += 1
        if delivered:
            target.append_delivered(key, delivered)
        await durable(target, f"the messages of {key!r}")
    return next_id


def _copy_durably(source: Path, target: Path) -> None:
    """A stream's directory copied, every file and the directories fsynced."""
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source, target)
    for path in target.iterdir():
        with open(path, "rb") as file:
            os.fsync(file.fileno())
    fsync_directory(target)
    fsync_directory(target.parent)
    fsync_directory(target.parent.parent)


def move_queue(data_dir: Path, vhost: str, queue: str, home: int, source: int, target: int) -> None:
    """Move a durable queue of vhost (whose worker is home) from worker source's store to target's, the three
    stopped, on this thread. MoveError if the home's record does not name source as its owner (it changed since the
    move was asked): then nothing moves."""
    move = {"vhost": vhost, "queue": queue, "home": home, "from": source, "to": target}
    write_durably(journal_path(data_dir), json.dumps(move))
    _finish_queue(data_dir, move)


def _finish_queue(data_dir: Path, move: dict) -> None:
    vhost, name, home, source, target = move["vhost"], move["queue"], move["home"], move["from"], move["to"]
    key, home_dir = queue_key(vhost, name), worker_data_dir(data_dir, home)
    record = asyncio.run(_record_of(home_dir, key))
    owner = None if record is None else record.get("owner", home)
    if owner == source:
        log.info("moving queue '%s' of vhost '%s' from worker %d to worker %d", name, vhost, source, target)
        assert record is not None, "a queue has a record at its home"
        try:
            asyncio.run(_copy_queue(worker_data_dir(data_dir, source), worker_data_dir(data_dir, target), key,
                                    _owned_by(record, home, home), target == home))
        except (MoveError, OSError) as error:  # given up: what was copied goes, the queue stays where it was
            asyncio.run(_remove_queue_from(worker_data_dir(data_dir, target), key, target == home))
            if target == home:
                asyncio.run(_record(home_dir, key, record, "its owner"))
            _forget(data_dir)
            raise MoveError(f"queue '{name}' of vhost '{vhost}' stays on worker {source}: {error}") from error
        if target != home:
            asyncio.run(_record(home_dir, key, _owned_by(record, target, home), "its owner"))
    elif owner != target:
        _forget(data_dir)
        raise MoveError(f"queue '{name}' of vhost '{vhost}' is not on worker {source} now (deleted, or declared again "
                        "since the move was asked): nothing moved")
    asyncio.run(_remove_queue_from(worker_data_dir(data_dir, source), key, source == home))
    _forget(data_dir)
    log.info("queue '%s' of vhost '%s' moved from worker %d to worker %d", name, vhost, source, target)


def _owned_by(record: dict, owner: int, home: int) -> dict:
    """A queue's record at its home once owner owns it: the record an owner keeps (no "owner"), where they are one."""
    data = {key: value for key, value in record.items() if key != "owner"}
    return data if owner == home else {**data, "owner": owner}


async def _record_of(data_dir: Path, key: str) -> dict | None:
    """The queue definition data_dir's store holds under key, if any."""
    with _opened(data_dir) as (store, _):
        return next((data for kind, name, data in store.definitions() if kind == "queue" and name == key), None)


async def _record(data_dir: Path, key: str, data: dict, what: str) -> None:
    with _opened(data_dir) as (store, _):
        store.append_definition("queue", key, data)
        await durable(store, f"{what} in {data_dir}")


async def _copy_queue(source_dir: Path, target_dir: Path, key: str, record: dict, at_home: bool) -> None:
    """The queue's stored messages copied from source's store to target's, then the record an owner keeps of it
    (at the home, the record that makes it the owner: written once the messages are on disk)."""
    with _opened(source_dir) as (_, from_source), _opened(target_dir) as (target, in_target):
        await _remove_queue(target, key, at_home)  # what an interrupted try left there
        await _copy_messages(target, key, from_source.messages.get(key), max(in_target.next_msg_id, 1))
        target.append_definition("queue", key, record)
        await durable(target, f"queue {key!r} in {target_dir}")


async def _remove_queue(store: MessageStore, key: str, at_home: bool) -> None:
    """The queue's messages leave store, and its definition too unless the store is its home's."""
    if at_home:
        store.drop_messages(key)
    else:
        store.delete_queue(key)
    await durable(store, f"the removal of queue {key!r}")


async def _remove_queue_from(data_dir: Path, key: str, at_home: bool) -> None:
    with _opened(data_dir) as (store, _):
        await _remove_queue(store, key, at_home)
