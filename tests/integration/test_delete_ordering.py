"""A queue deleted while it has consumers: the deleting channel gets queue.delete-ok before the server's basic.cancel
for its own consumers (RabbitMQ's frame order); consumers on other channels and connections get their basic.cancel
too, whenever it comes. kombu and py-amqp rely on that order: a cancel first raises ConsumerCancelled inside
queue_delete()."""

from __future__ import annotations

import amqp.exceptions
import kombu
import pytest
from pamqp import commands

from tests.integration.helpers import EVENT_TIMEOUT
from tests.integration.rawclient import RawClient, describe

CANCEL_NOTIFY = {"product": "rawclient", "capabilities": {"consumer_cancel_notify": True}}


def frames_until_quiet(client: RawClient, quiet: float = 0.5) -> list[tuple[int, object]]:
    """Every frame that arrives until nothing has come for `quiet` seconds."""
    frames = []
    while True:
        try:
            frames.append(client.read_frame(timeout=quiet))
        except TimeoutError:
            return frames


@pytest.mark.parametrize("durable", [False, True], ids=["transient", "durable"])
def test_delete_ok_comes_before_the_deleting_channels_cancel(broker, unique, durable):
    with RawClient.connect(broker) as deleter, RawClient.connect(broker) as other:
        for client in (deleter, other):
            client.handshake(client_properties=CANCEL_NOTIFY)
            client.open_channel(1)
        deleter.open_channel(2)
        deleter.send(1, commands.Queue.Declare(queue=unique, durable=durable))
        deleter.expect(commands.Queue.DeclareOk, channel=1)
        for client, channel, tag in ((deleter, 1, "mine"), (deleter, 2, "sibling"), (other, 1, "elsewhere")):
            client.send(channel, commands.Basic.Consume(queue=unique, consumer_tag=tag))
            client.expect(commands.Basic.ConsumeOk, channel=channel)
        deleter.send(1, commands.Queue.Delete(queue=unique))
        received = frames_until_quiet(deleter)
        on_channel_1 = [describe(value) for channel, value in received if channel == 1]
        assert on_channel_1 == ["Queue.DeleteOk(message_count=0)", "Basic.Cancel(consumer_tag='mine', nowait=True)"]
        assert [describe(value) for channel, value in received if channel == 2] == [
            "Basic.Cancel(consumer_tag='sibling', nowait=True)"]
        assert [describe(value) for _, value in frames_until_quiet(other)] == [
            "Basic.Cancel(consumer_tag='elsewhere', nowait=True)"]


def test_kombu_deletes_the_queue_it_consumes_without_consumer_cancelled(broker, unique):
    with kombu.Connection(f"amqp://guest:guest@{broker.host}:{broker.port}//") as connection:
        channel = connection.channel()
        queue = kombu.Queue(unique, channel=channel, durable=False)
        queue.declare()
        received = []
        consumer = kombu.Consumer(channel, [queue], callbacks=[lambda body, message: received.append(body)])
        consumer.consume()
        queue.delete()  # raised amqp.exceptions.ConsumerCancelled when the cancel came before delete-ok
        with pytest.raises(amqp.exceptions.ConsumerCancelled):
            connection.drain_events(timeout=EVENT_TIMEOUT)  # the cancel, after delete-ok
