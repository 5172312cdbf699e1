"""How an x-delayed-message exchange reads a message's x-delay header (the plugin's get_delay): integers, numbers in
strings and truncated floats of 1 to 2^32-1 ms delay it; anything else routes it at once."""

import pytest
from pamqp.commands import Basic

from broker.model.features.delayed_messages import MAX_DELAY_MS, delay_of
from broker.model.message import Address, Header, Message
from protocol.codec import encode_header_payload


def published(headers: dict | None) -> Message:
    header = Header(encode_header_payload(1, Basic.Properties(headers=headers)))
    return Message(Address("delayed", "key"), header, b"x")


@pytest.mark.parametrize("value, delay", [
    (1500, 1500), ("250", 250), (12.9, 12), (MAX_DELAY_MS, MAX_DELAY_MS),
    (0, 0), (-5, 0), (MAX_DELAY_MS + 1, 0), ("soon", 0), ("9" * 5000, 0), (True, 0), ([1], 0), ({"a": 1}, 0),
    (float("inf"), 0), (float("nan"), 0),
])
def test_the_delay_a_header_asks_for(value, delay):
    assert delay_of(published({"x-delay": value})) == delay


def test_no_header_no_delay():
    assert delay_of(published(None)) == 0
    assert delay_of(published({"other": 1})) == 0
