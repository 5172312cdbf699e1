"""The links' client against a peer that misbehaves: every wait is bounded, and what it reads too."""

from __future__ import annotations

import asyncio

import pytest
from pamqp import commands as spec

from broker.links import client
from broker.links.client import Link, LinkError
from broker.links.headers import prepend_table
from broker.links.uri import parse
from protocol.codec import decode_method, encode_method
from protocol.constants import FRAME_METHOD
from protocol.framing import FrameReader

SERVER_PROPERTIES = {"product": "a peer"}


async def peer(after_open) -> tuple[asyncio.Server, int]:
    """A peer that logs the client in, opens its channel, then does what after_open does with the writer."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(8)  # the protocol header
        frames = FrameReader(0)
        writer.write(encode_method(0, spec.Connection.Start(server_properties=SERVER_PROPERTIES,
                                                            mechanisms="PLAIN", locales="en_US")))
        answers = {spec.Connection.StartOk: (0, spec.Connection.Tune(channel_max=2, frame_max=131072, heartbeat=0)),
                   spec.Connection.Open: (0, spec.Connection.OpenOk()), spec.Channel.Open: (1, spec.Channel.OpenOk())}
        while data := await reader.read(65536):
            for frame_type, _, payload in frames.feed(data):
                method = decode_method(payload) if frame_type == FRAME_METHOD else None
                if type(method) in answers:
                    channel, answer = answers[type(method)]
                    writer.write(encode_method(channel, answer))
                    if isinstance(method, spec.Channel.Open):
                        after_open(writer)

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def test_a_peer_that_never_answers_a_method_fails_the_link_after_the_reply_timeout(monkeypatch):
    monkeypatch.setattr(client, "REPLY_TIMEOUT", 0.2)

    async def run() -> str:
        server, port = await peer(lambda writer: None)
        link = await Link.open(parse(f"amqp://127.0.0.1:{port}"), 5, "Shovel s", "Warren shovel")
        with pytest.raises(LinkError) as failed:
            await link.call(spec.Queue.Declare(queue="q", passive=True), spec.Queue.DeclareOk)
        server.close()
        return str(failed.value)

    assert asyncio.run(run()) == "no reply (DeclareOk) within 0.2 s"


def test_a_frame_larger_than_the_link_reads_fails_it_without_reading_it_whole():
    async def run() -> str:
        huge = b"\x03\x00\x01" + (64 * 1024 * 1024).to_bytes(4, "big")  # a body frame of 64 MiB announced
        server, port = await peer(lambda writer: writer.write(huge + b"\x00" * 65536))
        with pytest.raises(LinkError) as failed:  # (it comes with the channel's open-ok)
            await Link.open(parse(f"amqp://127.0.0.1:{port}"), 5, "Shovel s", "Warren shovel")
        server.close()
        return str(failed.value)

    assert "the peer sent what cannot be read: FRAME_ERROR" in asyncio.run(run())


def test_a_header_of_another_type_is_kept_in_x_invalid_headers_as_rabbitmq_keeps_it():
    headers = {"x-received-from": "not an array", "x-invalid-headers": "not a table"}
    prepend_table(headers, "x-received-from", {"hop": 1})
    assert headers == {"x-received-from": [{"hop": 1}], "x-invalid-headers": {"x-received-from": ["not an array"]}}
    headers["x-received-from"] = 7
    prepend_table(headers, "x-received-from", {"hop": 2})
    assert headers["x-invalid-headers"] == {"x-received-from": [7, "not an array"]}
