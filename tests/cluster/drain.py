"""Read a queue back through whichever node answers, and check what came back against what a publisher had confirmed.

    drained = drain(nodes, queue, timeout=30)  # {"ids": Counter, "read", "redelivered", "node", "attempts"}
    report = verify(result["confirmed"], drained)  # report.ok, report.missing_count, report.summary, ...

With a consumer that ran beside the publisher (tests.cluster.consumer), what it was delivered counts too:

    report = verify(result["confirmed"], with_consumed(drained, delivered_ids(consumer_result)))

drain() consumes with manual acks and acks everything with one multiple ack only once the whole queue is read: an
attempt cut short by a lost connection leaves every message in the queue, and the next attempt (on the next node,
round-robin every 100 ms) reads it all again from the start. It stops exactly: a passive declare gives the count
of ready messages, the consumer reads that many, and after basic.cancel another passive declare must find none.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pamqp import body, commands, header

from tests.cluster.ids import ID, Ranges, count_of, describe, to_ranges
from tests.cluster.publisher import node_address
from tests.integration.rawclient import RawClient
from tests.integration.rawclient import describe as describe_frame

DRAIN_RATE = 20_000  # messages a second a drain reads at least: its callers' timeouts grow with what was confirmed
RETRY_INTERVAL = 0.1  # seconds between attempts while no node serves the queue
CHANNEL = 1


class Node(NamedTuple):
    host: str
    port: int


class QueueMissing(LookupError):
    """A node answered that the queue does not exist: asking again will not bring it back."""


@dataclass
class Tally:
    """What one attempt has read so far."""

    ids: Counter[int] = field(default_factory=Counter)  # id -> how many times it was read
    redelivered: int = 0  # deliveries flagged redelivered
    last_tag: int = 0  # the delivery tag of the latest delivery

    def add(self, deliver: commands.Basic.Deliver, payload: bytes) -> None:
        self.ids[ID.unpack_from(payload)[0]] += 1
        self.redelivered += deliver.redelivered
        self.last_tag = deliver.delivery_tag


def drain(nodes: Sequence[Any], queue: str, timeout: float = 30.0) -> dict[str, Any]:
    """Read and ack every message of `queue` through the first node that serves it, trying `nodes` ('host:port'
    or objects with .host and .port) round-robin. Returns {"ids": Counter of the ids read, "read": messages read,
    "redelivered": how many came flagged redelivered, "node": where, "attempts": connections tried}."""
    addresses = [node_address(node) for node in nodes]
    deadline = time.monotonic() + timeout
    attempts = 0
    while True:
        address = addresses[attempts % len(addresses)]
        attempts += 1
        try:
            tally = _drain_from(address, queue, deadline)
        # refused, reset, closed by the node, too slow; RawClient's handshake asserts each reply it expects
        except (OSError, TimeoutError, AssertionError) as error:
            if time.monotonic() + RETRY_INTERVAL >= deadline:
                raise TimeoutError(f"could not drain {queue!r} within {timeout} s; last from {address}: {error}") \
                    from error
            time.sleep(RETRY_INTERVAL)
            continue
        return {"ids": tally.ids, "read": tally.ids.total(), "redelivered": tally.redelivered, "node": address,
                "attempts": attempts}


def _drain_from(address: str, queue: str, deadline: float) -> Tally:
    host, port = address.rsplit(":", 1)
    with RawClient.connect(Node(host, int(port)), timeout=_left(deadline)) as client:  # each read within it
        client.handshake()
        client.open_channel(CHANNEL)
        tally = Tally()
        consumers = 0  # consumers started so far: each takes what the latest passive declare counted
        while ready := _call(client, commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk,
                             deadline).message_count:
            consumers += 1
            _consume(client, queue, f"drain-{consumers}", ready, tally, deadline)
        if tally.last_tag:
            client.send(CHANNEL, commands.Basic.Ack(delivery_tag=tally.last_tag, multiple=True))
        client.close_connection()  # its close-ok comes after the ack was handled
        return tally


def _consume(client: RawClient, queue: str, tag: str, ready: int, tally: Tally, deadline: float) -> None:
    """Read `ready` deliveries, then cancel, taking any delivery that was already on its way."""
    _call(client, commands.Basic.Consume(queue=queue, consumer_tag=tag), commands.Basic.ConsumeOk, deadline)
    for _ in range(ready):
        deliver = _expect(client, commands.Basic.Deliver, deadline)
        tally.add(deliver, _content(client, deadline))
    client.send(CHANNEL, commands.Basic.Cancel(consumer_tag=tag))
    while isinstance(frame := _next(client, deadline), commands.Basic.Deliver):
        tally.add(frame, _content(client, deadline))
    if not isinstance(frame, commands.Basic.CancelOk):
        raise ConnectionError(f"expected basic.cancel-ok, got {describe_frame(frame)}")


def _content(client: RawClient, deadline: float) -> bytes:
    """The body that follows a delivery."""
    size = _expect(client, header.ContentHeader, deadline).body_size
    payload = b""
    while len(payload) < size:
        payload += _expect(client, body.ContentBody, deadline).value
    return payload


def _call(client: RawClient, method: Any, reply: type, deadline: float) -> Any:
    client.send(CHANNEL, method)
    return _expect(client, reply, deadline)


def _expect(client: RawClient, kind: type, deadline: float) -> Any:
    frame = _next(client, deadline)
    if not isinstance(frame, kind):
        raise ConnectionError(f"expected {kind.__name__}, got {describe_frame(frame)}")
    return frame


def _next(client: RawClient, deadline: float) -> Any:
    """The next frame; a close of the channel or the connection raises (QueueMissing for 404 NOT_FOUND)."""
    _, frame = client.read_frame(timeout=_left(deadline))
    if isinstance(frame, commands.Channel.Close) and frame.reply_code == 404:
        raise QueueMissing(frame.reply_text)
    if isinstance(frame, (commands.Channel.Close, commands.Connection.Close)):
        raise ConnectionError(f"closed by the node: {frame.reply_code} {frame.reply_text}")
    return frame


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("out of time")
    return left


def with_consumed(drained: dict[str, Any], consumed: Counter[int]) -> dict[str, Any]:
    """drain()'s result with the ids a consumer was delivered (id -> times) added to its own, so that verify() asks
    that every confirmed id was consumed or drained. "read" counts both; "redelivered" stays the drain's."""
    return {**drained, "ids": drained["ids"] + consumed, "read": drained["read"] + consumed.total()}


@dataclass
class Verification:
    """What a drain brought back, measured against the ids the publisher saw confirmed."""

    confirmed: int  # ids confirmed
    read: int  # messages read back (drained, or consumed: with_consumed)
    missing: Ranges  # confirmed ids never read back: must be none
    duplicates: int  # reads beyond the first of an id (republished after a loss, or redelivered)
    duplicated_ids: int  # ids read more than once
    unconfirmed_read: int  # ids read that were never confirmed: published, their confirm lost; allowed
    redelivered: int  # messages that came back flagged redelivered

    @property
    def missing_count(self) -> int:
        return count_of(self.missing)

    @property
    def ok(self) -> bool:
        return not self.missing

    @property
    def summary(self) -> str:
        lost = f"{self.missing_count} confirmed ids MISSING ({describe(self.missing)})" if self.missing \
            else "0 confirmed ids missing"
        return (f"{self.confirmed} confirmed, {self.read} read back: {lost}; {self.duplicates} duplicates of "
                f"{self.duplicated_ids} ids; {self.unconfirmed_read} ids read that were never confirmed; "
                f"{self.redelivered} redelivered")


def verify(confirmed: Ranges, drained: dict[str, Any]) -> Verification:
    """Compare a publisher's confirmed ranges (its result's "confirmed") with a drain()'s result."""
    ids: Counter[int] = drained["ids"]
    starts = [start for start, _ in confirmed]

    def was_confirmed(id_: int) -> bool:
        run = bisect_right(starts, id_) - 1
        return run >= 0 and id_ < confirmed[run][1]

    missing = to_ranges(id_ for start, stop in confirmed for id_ in range(start, stop) if id_ not in ids)
    return Verification(
        confirmed=count_of(confirmed),
        read=ids.total(),
        missing=missing,
        duplicates=ids.total() - len(ids),
        duplicated_ids=sum(1 for times in ids.values() if times > 1),
        unconfirmed_read=sum(1 for id_ in ids if not was_confirmed(id_)),
        redelivered=drained["redelivered"],
    )
