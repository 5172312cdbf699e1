"""A channel whose reply waits for the disk holds the frames that arrive for it meanwhile; past a bound its
connection is not read until the reply is sent, so a client cannot fill the broker's memory behind a slow fsync.

The broker runs in this process (on a thread of its own) so that the test can hold back the disk's answer: the store's
fdatasync waits until the test lets it return."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from types import SimpleNamespace

from pamqp import commands

from broker.config import load_config
from broker.connection.server import Server
from broker.session.channel import BACKLOG_LIMIT
from tests.integration.rawclient import RawClient
from tests.waiting import wait_for

PUBLISHES = 200_000  # about 15 MB of frames: far more than the socket buffers and the broker may hold


class BrokerThread:
    """A Server on an event loop of its own thread, whose disk syncs only when told to."""

    def __init__(self, data_dir, monkeypatch) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.server = Server(load_config(None, {"host": "127.0.0.1", "port": 0, "data_dir": str(data_dir),
                                                   "mqtt_port": 0}))
        self.disk = threading.Event()  # set while the disk answers: fdatasync waits for it
        self.disk.set()
        fdatasync = os.fdatasync

        def held_fdatasync(fd: int) -> None:
            self.disk.wait()
            fdatasync(fd)

        monkeypatch.setattr(os, "fdatasync", held_fdatasync)

    def start(self) -> SimpleNamespace:
        self.thread.start()
        self.call(self.server.start())
        self.disk.clear()
        return SimpleNamespace(host="127.0.0.1", port=self.server.port)

    def call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=30)

    def read(self, function):
        async def run():
            return function()
        return self.call(run())

    def answer_the_disk(self) -> None:
        self.disk.set()

    def stop(self) -> None:
        self.disk.set()
        self.call(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)


def test_frames_held_behind_a_slow_disk_stop_the_reading(tmp_path, monkeypatch):
    broker = BrokerThread(tmp_path / "data", monkeypatch)
    address = broker.start()
    try:
        with RawClient.connect(address) as client:
            client.handshake()
            client.open_channel(1)
            client.send(1, commands.Queue.Declare(queue="held", durable=True))
            frames = b"".join(_publish_frames(client, number) for number in range(PUBLISHES))
            client.sock.settimeout(0.2)
            sent = _send_what_the_broker_takes(client, frames, seconds=3)

            connection = broker.read(lambda: next(iter(broker.server.connections)))
            paused = broker.read(connection.reading_paused)
            held_bytes = broker.read(lambda: sum(len(payload) for _, _, payload in connection.channels[1].backlog))
            assert paused, "the connection is still read while its channel waits for the disk"
            assert sent < len(frames), "the broker took every frame while its channel waited for the disk"
            assert broker.read(lambda: len(connection.channels[1].backlog)) >= BACKLOG_LIMIT
            assert held_bytes < 1 << 20, f"{held_bytes} bytes of frames held behind the disk"

            broker.answer_the_disk()
            client.sock.settimeout(5)
            client.expect(commands.Queue.DeclareOk, channel=1)  # the held reply comes first
            client.sock.sendall(frames[sent:])
            handled = lambda: len(broker.server.node.vhosts["/"].queues["held"].entries)  # noqa: E731
            wait_for(lambda: broker.read(handled) >= PUBLISHES, 30, "the held publishes all handled", 0.05)
    finally:
        broker.stop()


def _publish_frames(client: RawClient, number: int) -> bytes:
    """One transient basic.publish (method, header, body) to the queue, as bytes."""
    sent: list[bytes] = []
    send_raw, client.send_raw = client.send_raw, sent.append
    try:
        client.publish(1, "", "held", b"%d" % number)
    finally:
        client.send_raw = send_raw
    return b"".join(sent)


def _send_what_the_broker_takes(client: RawClient, data: bytes, seconds: float) -> int:
    """Send data until the broker stops reading (the socket buffers fill) or everything went; return the bytes sent."""
    view = memoryview(data)
    sent = 0
    deadline = time.monotonic() + seconds
    while sent < len(view) and time.monotonic() < deadline:
        try:
            sent += client.sock.send(view[sent:sent + 65536])
        except TimeoutError:
            continue
    return sent
