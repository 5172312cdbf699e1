"""Return counts, delivery limits and delayed retry as RabbitMQ 4.3 works them out (rabbit_fifo,
rabbit_quorum_queue)."""

import pytest
from pamqp.commands import Basic

from broker.model import message as messages
from broker.model.features.redelivery import (
    DelayedRetry, consumer_delayed_retry, count_return, delayed_retry, delivery_limit,
)
from protocol.codec import encode_header_payload


def entry(headers: dict | None = None) -> messages.QueueEntry:
    header = messages.Header(encode_header_payload(1, Basic.Properties(headers=headers, priority=3)))
    return messages.QueueEntry(0, messages.Message(messages.Address("", "q"), header, b"x", msg_id=7))


def test_every_return_counts_as_acquired_and_failed_ones_as_deliveries():
    item = entry({"app": "kept"})
    count_return(item, failed=False, annotate=True)
    assert item.message.headers == {"app": "kept", "x-acquired-count": 1}
    count_return(item, failed=True, annotate=True)
    assert item.message.headers == {"app": "kept", "x-acquired-count": 2, "x-delivery-count": 1}
    assert (item.redelivered, item.message.msg_id, item.message.properties.priority) == (True, 7, 3)


def test_without_annotations_the_message_is_untouched():
    item = entry()
    original = item.message
    count_return(item, failed=True, annotate=False)
    assert (item.message is original, item.acquired_count, item.delivery_count) == (True, 1, 1)


@pytest.mark.parametrize("settings, quorum, limit", [
    ({}, True, 20), ({}, False, None), ({"delivery-limit": -1}, True, None), ({"delivery-limit": 0}, False, 0),
    ({"delivery-limit": 5}, True, 5),
])
def test_delivery_limit(settings, quorum, limit):
    assert delivery_limit(settings, quorum) == limit


def test_the_delay_is_linear_in_failed_returns_and_capped():
    retry = DelayedRetry("all", 100, 250)
    item = entry()
    assert retry.delay_ms(item, failed=False) == 100  # no failed return yet: at least the minimum
    item.delivery_count = 2
    assert retry.delay_ms(item, failed=True) == 200
    item.delivery_count = 5
    assert retry.delay_ms(item, failed=True) == 250


@pytest.mark.parametrize("kind, failed, delayed", [
    ("failed", True, True), ("failed", False, False), ("returned", False, True), ("returned", True, False),
])
def test_the_type_picks_the_returns_that_wait(kind, failed, delayed):
    assert bool(DelayedRetry(kind, 100, 100).delay_ms(entry(), failed)) == delayed


def test_settings_without_a_minimum_or_disabled_mean_no_delayed_retry():
    assert delayed_retry({"delayed-retry-type": "all"}) is None
    assert delayed_retry({"delayed-retry-type": "disabled", "delayed-retry-min": 5}) is None
    assert delayed_retry({"delayed-retry-type": b"failed", "delayed-retry-min": 5}) == DelayedRetry("failed", 5, 5)
    assert consumer_delayed_retry({"x-delayed-retry-type": "all", "x-delayed-retry-min": 5,
                                   "x-delayed-retry-max": 9, "x-priority": 1}) == DelayedRetry("all", 5, 9)
