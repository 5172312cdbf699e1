"""Which queues get a published message: default, direct, fanout, topic and headers exchanges, alternate exchanges,
exchange-to-exchange chains, and one copy per queue however many bindings match."""

from __future__ import annotations

import pika

from tests.integration.helpers import declare_queue, get_all


def test_default_exchange_routes_by_queue_name(channel, unique):
    queue = declare_queue(channel, unique, exclusive=True)
    channel.basic_publish("", queue, b"direct to queue")
    channel.basic_publish("", f"{unique}-no-such-queue", b"dropped")
    assert get_all(channel, queue) == [b"direct to queue"]


def test_every_queue_is_bound_to_the_default_exchange_only_by_its_own_name(channel, unique):
    first, second = (declare_queue(channel, f"{unique}-{index}", exclusive=True) for index in (1, 2))
    channel.basic_publish("", second, b"for second")
    assert (get_all(channel, first), get_all(channel, second)) == ([], [b"for second"])


def test_direct_exchange_matches_the_exact_key(channel, unique):
    channel.exchange_declare(unique, "direct", auto_delete=True)
    red, green = declare_queue(channel, exclusive=True), declare_queue(channel, exclusive=True)
    channel.queue_bind(red, unique, "red")
    channel.queue_bind(green, unique, "green")
    channel.queue_bind(green, unique, "both")
    channel.queue_bind(red, unique, "both")
    for key in ("red", "green", "both", "Red", "red.x", ""):
        channel.basic_publish(unique, key, key.encode())
    assert get_all(channel, red) == [b"red", b"both"]
    assert get_all(channel, green) == [b"green", b"both"]


def test_fanout_ignores_the_routing_key(channel, unique):
    channel.exchange_declare(unique, "fanout", auto_delete=True)
    queues = [declare_queue(channel, exclusive=True) for _ in range(3)]
    for index, queue in enumerate(queues):
        channel.queue_bind(queue, unique, f"key-{index}")
    channel.basic_publish(unique, "anything", b"to all")
    assert [get_all(channel, queue) for queue in queues] == [[b"to all"]] * 3


TOPIC_CASES = [
    # (binding pattern, routing key, routed?)
    ("a.b.c", "a.b.c", True),
    ("a.b.c", "a.b", False),
    ("a.*.c", "a.b.c", True),
    ("a.*.c", "a.c", False),
    ("a.*.c", "a.b.b.c", False),
    ("*", "a", True),
    ("*", "a.b", False),
    ("*", "", False),  # the empty key has no words at all ...
    ("a.*", "a.", True),  # ... but an empty word between or after dots counts as a word
    ("a.*", "a", False),
    ("a.*.b", "a..b", True),
    ("#", "", True),
    ("#", "a.b.c", True),
    ("a.#", "a", True),  # '#' matches zero words
    ("a.#", "a.b.c", True),
    ("a.#", "ab", False),
    ("#.a", "a", True),
    ("#.a", "x.y.a", True),
    ("#.a", "a.x", False),
    ("a.#.b", "a.b", True),
    ("a.#.b", "a.x.y.b", True),
    ("a.#.b", "a.x.y.c", False),
    ("#.#", "", True),
    ("*.#", "", False),
    ("#.*", "a.b", True),
    ("*.*", "a", False),
    ("a.#.#.b", "a.b", True),
    ("*.a.#", "x.a", True),
    ("", "", True),
    ("", "a", False),
    ("a", "", False),
]


def test_topic_patterns_with_star_and_hash(channel, unique):
    channel.exchange_declare(unique, "topic", auto_delete=True)
    queues = []
    for pattern, _, _ in TOPIC_CASES:
        queue = declare_queue(channel, exclusive=True)
        channel.queue_bind(queue, unique, pattern)
        queues.append(queue)
    for index, (_, key, _) in enumerate(TOPIC_CASES):
        channel.basic_publish(unique, key, str(index).encode())
    outcome = {}
    for index, (pattern, key, _) in enumerate(TOPIC_CASES):
        outcome[(pattern, key)] = str(index).encode() in get_all(channel, queues[index])
    assert outcome == {(pattern, key): routed for pattern, key, routed in TOPIC_CASES}


def test_topic_binding_removal_leaves_the_others(channel, unique):
    channel.exchange_declare(unique, "topic", auto_delete=True)
    queue = declare_queue(channel, exclusive=True)
    channel.queue_bind(queue, unique, "logs.#")
    channel.queue_bind(queue, unique, "*.error")
    channel.queue_unbind(queue, unique, "logs.#")
    for key in ("logs.info", "app.error", "logs.error"):
        channel.basic_publish(unique, key, key.encode())
    assert get_all(channel, queue) == [b"app.error", b"logs.error"]


HEADERS_MESSAGE = {"format": "pdf", "type": "report", "pages": 3, "x-origin": "scanner"}

HEADERS_CASES = [
    # (binding arguments, routed?) for a message with HEADERS_MESSAGE
    ({"x-match": "all", "format": "pdf", "type": "report"}, True),
    ({"x-match": "all", "format": "pdf", "type": "log"}, False),
    ({"x-match": "all", "format": "pdf", "missing": "x"}, False),
    ({"x-match": "any", "format": "zip", "type": "report"}, True),
    ({"x-match": "any", "format": "zip", "type": "log"}, False),
    ({"format": "pdf", "type": "report"}, True),  # x-match defaults to all
    ({"format": "pdf", "type": "log"}, False),
    ({"x-match": "all"}, True),  # nothing to compare: matches
    ({}, True),
    ({"x-match": "all", "pages": 3}, True),
    ({"x-match": "all", "pages": "3"}, False),  # values compare with their types
    ({"x-match": "all", "format": "pdf", "x-origin": "elsewhere"}, True),  # x- arguments are ignored by all ...
    ({"x-match": "any", "x-origin": "scanner"}, False),  # ... and by any
    ({"x-match": "all-with-x", "format": "pdf", "x-origin": "scanner"}, True),  # ... but not by *-with-x
    ({"x-match": "all-with-x", "format": "pdf", "x-origin": "elsewhere"}, False),
    ({"x-match": "any-with-x", "x-origin": "scanner"}, True),
    ({"x-match": "any-with-x", "x-origin": "elsewhere", "format": "zip"}, False),
]


def test_headers_exchange_x_match_variants(channel, unique):
    channel.exchange_declare(unique, "headers", auto_delete=True)
    queues = []
    for arguments, _ in HEADERS_CASES:
        queue = declare_queue(channel, exclusive=True)
        channel.queue_bind(queue, unique, "ignored-key", arguments=arguments)
        queues.append(queue)
    channel.basic_publish(unique, "any-key", b"doc", pika.BasicProperties(headers=HEADERS_MESSAGE))
    routed = [get_all(channel, queue) == [b"doc"] for queue in queues]
    assert routed == [expected for _, expected in HEADERS_CASES], [
        arguments for (arguments, expected), got in zip(HEADERS_CASES, routed) if expected != got]


def test_headers_exchange_without_message_headers(channel, unique):
    channel.exchange_declare(unique, "headers", auto_delete=True)
    match_all, match_one = declare_queue(channel, exclusive=True), declare_queue(channel, exclusive=True)
    channel.queue_bind(match_all, unique, arguments={"x-match": "all"})
    channel.queue_bind(match_one, unique, arguments={"x-match": "any", "format": "pdf"})
    channel.basic_publish(unique, "", b"bare")
    assert (get_all(channel, match_all), get_all(channel, match_one)) == ([b"bare"], [])


def test_alternate_exchange_receives_unroutable_messages(channel, unique):
    alternate = f"{unique}-ae"
    channel.exchange_declare(alternate, "fanout", auto_delete=True)
    channel.exchange_declare(unique, "direct", auto_delete=True, arguments={"alternate-exchange": alternate})
    routed, unrouted = declare_queue(channel, exclusive=True), declare_queue(channel, exclusive=True)
    channel.queue_bind(routed, unique, "known")
    channel.queue_bind(unrouted, alternate)
    channel.basic_publish(unique, "known", b"routed")
    channel.basic_publish(unique, "unknown", b"unroutable")
    assert (get_all(channel, routed), get_all(channel, unrouted)) == ([b"routed"], [b"unroutable"])
    channel.exchange_delete(unique)


def test_alternate_exchanges_chain_and_a_missing_one_drops_silently(channel, unique):
    first, second = f"{unique}-ae1", f"{unique}-ae2"
    channel.exchange_declare(second, "fanout", auto_delete=True)
    channel.exchange_declare(first, "direct", auto_delete=True, arguments={"alternate-exchange": second})
    channel.exchange_declare(unique, "direct", auto_delete=True, arguments={"alternate-exchange": first})
    last_resort = declare_queue(channel, exclusive=True)
    channel.queue_bind(last_resort, second)
    channel.basic_publish(unique, "nowhere", b"through two")
    assert get_all(channel, last_resort) == [b"through two"]

    orphan = f"{unique}-orphan"
    channel.exchange_declare(orphan, "direct", auto_delete=True, arguments={"alternate-exchange": f"{unique}-gone"})
    channel.confirm_delivery()
    channel.basic_publish(orphan, "nowhere", b"dropped")  # confirmed, not an error
    assert channel.is_open
    for name in (unique, first, orphan):
        channel.exchange_delete(name)


def test_exchange_to_exchange_chain_routes_through_each_type(channel, unique):
    topic, fanout = f"{unique}-topic", f"{unique}-fanout"
    channel.exchange_declare(topic, "topic", auto_delete=True)
    channel.exchange_declare(fanout, "fanout", auto_delete=True)
    channel.exchange_bind(fanout, topic, "sensor.#")
    first, second = declare_queue(channel, exclusive=True), declare_queue(channel, exclusive=True)
    channel.queue_bind(first, fanout)
    channel.queue_bind(second, fanout)
    channel.basic_publish(topic, "sensor.kitchen.temp", b"21C")
    channel.basic_publish(topic, "door.front", b"open")
    assert (get_all(channel, first), get_all(channel, second)) == ([b"21C"], [b"21C"])
    channel.exchange_delete(topic)


def test_one_copy_per_queue_however_many_bindings_match(channel, unique):
    topic, direct = f"{unique}-topic", f"{unique}-direct"
    channel.exchange_declare(topic, "topic", auto_delete=True)
    channel.exchange_declare(direct, "direct", auto_delete=True)
    queue = declare_queue(channel, exclusive=True)
    for pattern in ("a.b", "a.*", "#", "a.#"):
        channel.queue_bind(queue, topic, pattern)
    channel.exchange_bind(direct, topic, "a.b")  # a second path to the same queue
    channel.queue_bind(queue, direct, "a.b")
    channel.basic_publish(topic, "a.b", b"once")
    assert get_all(channel, queue) == [b"once"]
    channel.exchange_delete(topic)


def test_exchange_to_exchange_cycles_deliver_once(channel, unique):
    left, right = f"{unique}-left", f"{unique}-right"
    channel.exchange_declare(left, "fanout", auto_delete=True)
    channel.exchange_declare(right, "fanout", auto_delete=True)
    channel.exchange_bind(right, left)
    channel.exchange_bind(left, right)
    queue = declare_queue(channel, exclusive=True)
    channel.queue_bind(queue, right)
    channel.basic_publish(left, "", b"loop")
    assert get_all(channel, queue) == [b"loop"]
    channel.exchange_delete(left)
    channel.exchange_delete(right)


def test_order_is_kept_per_queue(channel, unique):
    channel.exchange_declare(unique, "fanout", auto_delete=True)
    first, second = declare_queue(channel, exclusive=True), declare_queue(channel, exclusive=True)
    channel.queue_bind(first, unique)
    channel.queue_bind(second, unique)
    sent = [str(index).encode() for index in range(50)]
    for body in sent:
        channel.basic_publish(unique, "", body)
    assert (get_all(channel, first), get_all(channel, second)) == (sent, sent)
