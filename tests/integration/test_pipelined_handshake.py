"""Frames a client sends right behind connection.tune-ok, in the same write: RabbitMQ reads each frame with the
limits of its time, so everything after tune-ok is judged by the negotiated frame_max, not the 4 KiB that holds
before it."""

from __future__ import annotations

from pamqp import body, commands, frame, header

from tests.integration.rawclient import RawClient, plain_response


def _pipelined(channel: int, *values) -> bytes:
    return b"".join(frame.marshal(value, channel) for value in values)


def test_frames_in_the_write_of_tune_ok_get_the_negotiated_frame_max(broker, unique):
    payload = bytes(range(256)) * 32  # 8 KiB: one body frame twice the pre-tune limit of 4096 bytes
    with RawClient.connect(broker) as client:
        client.send_protocol_header()
        client.expect(commands.Connection.Start, channel=0)
        client.send(0, commands.Connection.StartOk(
            client_properties={"capabilities": {"authentication_failure_close": True}}, mechanism="PLAIN",
            response=plain_response("guest", "guest"), locale="en_US"))
        tune = client.expect(commands.Connection.Tune, channel=0)
        assert tune.frame_max >= 16384
        client.send_raw(
            _pipelined(0, commands.Connection.TuneOk(channel_max=tune.channel_max, frame_max=16384, heartbeat=0),
                       commands.Connection.Open(virtual_host="/"))
            + _pipelined(1, commands.Channel.Open(),
                         commands.Queue.Declare(queue=unique, exclusive=True),
                         commands.Basic.Publish(exchange="", routing_key=unique),
                         header.ContentHeader(0, len(payload), commands.Basic.Properties()),
                         body.ContentBody(payload),
                         commands.Basic.Get(queue=unique, no_ack=True)))
        client.expect(commands.Connection.OpenOk, channel=0)
        client.expect(commands.Channel.OpenOk, channel=1)
        client.expect(commands.Queue.DeclareOk, channel=1)
        client.expect(commands.Basic.GetOk, channel=1)
        assert client.expect(header.ContentHeader, channel=1).body_size == len(payload)
        assert client.expect(body.ContentBody, channel=1).value == payload
        # the negotiated limit holds from tune-ok on: a frame over 16 KiB is still refused
        client.publish(1, "", unique, b"x" * 16385, frame_max=32768)
        close = client.expect_connection_close()
        assert (close.reply_code, close.reply_text) == (
            501, "FRAME_ERROR - type 3, all octets = <<>>: {frame_too_large,16385,16376}")
