"""The x-death history of a dead-lettered message, as RabbitMQ 3.x writes it: one entry per (queue, reason), the
newest death first, a repeated death counted in its entry (which moves to the front), x-first-death-* set once."""

import asyncio
import datetime
import struct

from pamqp.commands import Basic

# The modules under test, named once: the rest of the file uses only these names.
from broker.model.features import dead_letter as deaths
from broker.model import message as messages
from broker.model.message import QueueEntry
from broker.model.vhost import VirtualHost
from protocol.codec import LongLong, encode_header_payload

MONDAY = datetime.datetime(2026, 11, 23, 9, 0, tzinfo=datetime.timezone.utc)
TUESDAY = MONDAY + datetime.timedelta(days=1)


def died(headers: dict, queue: str, reason: str, now=MONDAY, expiration: str | None = None) -> dict:
    """The headers after one more death in `queue` (published to exchange "ex" with routing key "rk")."""
    return deaths.record_death(headers, queue, reason, "ex", ["rk"], expiration, now)


def published(body: bytes, routing_key: str, **properties) -> messages.Message:
    header = messages.Header(encode_header_payload(len(body), Basic.Properties(**properties)))
    return messages.Message(messages.Address("ex", routing_key), header, body)


def test_a_first_death_starts_the_history():
    headers = died({"app": "kept"}, "orders", deaths.REJECTED)
    assert headers == {
        "app": "kept",
        "x-death": [{"count": 1, "reason": "rejected", "queue": "orders", "time": MONDAY, "exchange": "ex",
                     "routing-keys": ["rk"]}],
        "x-first-death-exchange": "ex",
        "x-first-death-queue": "orders",
        "x-first-death-reason": "rejected",
    }


def test_the_count_is_a_64_bit_integer_on_the_wire():
    count = died({}, "orders", deaths.EXPIRED)["x-death"][0]["count"]
    assert type(count) is LongLong


def test_a_death_elsewhere_goes_in_front_and_the_first_death_stays():
    headers = died(died({}, "orders", deaths.EXPIRED), "retries", deaths.MAXLEN, now=TUESDAY)
    assert [(death["queue"], death["reason"], death["count"]) for death in headers["x-death"]] == [
        ("retries", "maxlen", 1), ("orders", "expired", 1)]
    assert (headers["x-first-death-queue"], headers["x-first-death-reason"]) == ("orders", "expired")


def test_a_repeated_death_is_counted_in_its_entry_which_moves_to_the_front():
    headers = died({}, "work", deaths.EXPIRED)
    headers = died(headers, "wait", deaths.EXPIRED)
    headers = died(headers, "work", deaths.EXPIRED, now=TUESDAY)
    assert [(death["queue"], death["count"]) for death in headers["x-death"]] == [("work", 2), ("wait", 1)]
    assert headers["x-death"][0]["time"] == MONDAY  # the entry keeps the time of its first death
    assert type(headers["x-death"][0]["count"]) is LongLong


def test_the_same_queue_for_another_reason_is_another_entry():
    headers = died(died({}, "work", deaths.REJECTED), "work", deaths.EXPIRED)
    assert [(death["reason"], death["count"]) for death in headers["x-death"]] == [("expired", 1), ("rejected", 1)]


def test_the_original_expiration_is_recorded_when_the_message_had_one():
    entry = died({}, "orders", deaths.EXPIRED, expiration="5000")["x-death"][0]
    assert entry["original-expiration"] == "5000"
    assert "original-expiration" not in died({}, "orders", deaths.EXPIRED)["x-death"][0]


def test_a_history_that_came_back_with_a_republished_message_counts_on():
    history = [{"count": 3, "reason": "rejected", "queue": "old", "time": MONDAY, "exchange": "ex",
                "routing-keys": ["rk"]}]
    headers = died({"x-death": history, "x-first-death-queue": "first"}, "old", deaths.REJECTED, now=TUESDAY)
    assert headers["x-death"] == [dict(history[0], count=4)]
    assert headers["x-first-death-queue"] == "first"


def test_the_dead_lettered_message_keeps_its_body_and_loses_its_expiration_and_carbon_copies():
    message = published(b"payload", "rk", expiration="60000", headers={"CC": ["cc-key"], "BCC": ["bcc-key"]})
    out, keys = deaths.dead_lettered(message, "orders", deaths.EXPIRED, "dlx", None)
    assert (out.exchange, out.routing_key, out.body) == ("dlx", "rk", b"payload")
    assert keys == ["rk", "cc-key"]  # republished with the keys it was published with (BCC is not recorded)
    properties = out.properties
    assert properties.expiration is None
    assert "CC" not in properties.headers and "BCC" not in properties.headers
    death = properties.headers["x-death"][0]
    assert (death["queue"], death["reason"], death["exchange"], death["routing-keys"], death["original-expiration"],
            death["count"]) == ("orders", "expired", "ex", ["rk", "cc-key"], "60000", 1)


def test_a_dead_letter_routing_key_replaces_the_message_keys():
    message = published(b"payload", "rk", headers={"CC": ["cc-key"]})
    out, keys = deaths.dead_lettered(message, "orders", deaths.REJECTED, "dlx", "parking")
    assert (out.routing_key, keys) == ("parking", ["parking"])
    assert out.properties.headers["x-death"][0]["routing-keys"] == ["rk", "cc-key"]


def test_messages_sharing_a_content_header_are_each_dead_lettered_with_their_own_size_and_keys():
    """One publisher's messages share their content header: dead-lettering decodes it once per address, and each
    message still carries its own body size and its own routing key in its history."""
    class Owner:
        exclusive_queues: set = set()

    async def run():
        vhost = VirtualHost("/")
        source = vhost.declare_queue("src", Owner(), False, False, False, False,
                                     {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
        dead = vhost.declare_queue("dead", Owner(), False, False, False, False, {})
        header = messages.Header(encode_header_payload(1, Basic.Properties(app_id="one publisher")))
        entries = [QueueEntry(seq, messages.Message(messages.Address("", key), header, body))
                   for seq, (key, body) in enumerate([("a", b"1"), ("a", b"22"), ("b", b"333"), ("a", b"4444")])]
        deaths.dead_letter(source, entries, deaths.REJECTED)
        return [entry.message for entry in dead.entries]

    out = asyncio.run(run())
    assert [message.body for message in out] == [b"1", b"22", b"333", b"4444"]
    assert [struct.unpack_from(">Q", message.header.payload, 4)[0] for message in out] == [1, 2, 3, 4]  # body size
    assert [message.properties.headers["x-death"][0]["routing-keys"] for message in out] == [["a"], ["a"], ["b"], ["a"]]
    assert {message.properties.app_id for message in out} == {"one publisher"}
