"""Content frames must follow their method in order: method, header, body. Anything else is 505 UNEXPECTED_FRAME."""

import struct

import pytest
from pamqp import commands, header
from pamqp import frame as pamqp_frame

from tests.integration.rawclient import RawClient, raw_frame

PUBLISH = pamqp_frame.marshal(commands.Basic.Publish(exchange="", routing_key="nowhere"), 1)
HEADER = pamqp_frame.marshal(header.ContentHeader(body_size=3), 1)
BODY = raw_frame(3, 1, b"abc")
OTHER_METHOD = pamqp_frame.marshal(commands.Basic.Qos(prefetch_count=1), 1)
WRONG_CLASS_HEADER = raw_frame(2, 1, struct.pack(">HHQH", 50, 0, 3, 0))

EXPECTED_HEADER = "UNEXPECTED_FRAME - expected content header for class 60, got non content header frame instead"
EXPECTED_BODY = "UNEXPECTED_FRAME - expected content body, got non content body frame instead"
EXPECTED_METHOD = "UNEXPECTED_FRAME - expected method frame, got non method frame instead"


@pytest.mark.parametrize("frames, text, class_id, method_id", [
    ([PUBLISH, OTHER_METHOD], EXPECTED_HEADER, 60, 40),
    ([PUBLISH, BODY], EXPECTED_HEADER, 60, 40),
    ([PUBLISH, HEADER, OTHER_METHOD], EXPECTED_BODY, 60, 40),
    ([PUBLISH, HEADER, HEADER], EXPECTED_BODY, 60, 40),
    ([HEADER], EXPECTED_METHOD, 0, 0),
    ([BODY], EXPECTED_METHOD, 0, 0),
    ([PUBLISH, WRONG_CLASS_HEADER],
     "UNEXPECTED_FRAME - expected content header for class 60, got one for class 50 instead", 60, 40),
], ids=["method-for-header", "body-for-header", "method-for-body", "header-for-body", "header-alone",
        "body-alone", "header-of-another-class"])
def test_out_of_order_content_closes_the_connection_with_505(broker, frames, text, class_id, method_id):
    with RawClient.connect(broker) as client:
        client.handshake()
        client.open_channel(1)
        client.send_raw(b"".join(frames))
        client.expect_connection_error(505, text, class_id, method_id)
