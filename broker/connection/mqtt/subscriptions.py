"""An MQTT session's subscriptions as the AMQP objects RabbitMQ makes of them: the session queues
mqtt-subscription-<client id>qos0 and qos1, each bound to the MQTT exchange by the filters subscribed at that QoS
and consumed by the connection's channel; and 5.0's shared subscriptions ($share/<group>/<filter>), one queue per
group and filter that the members' channels consume in turn. A 5.0 subscription's options are its binding's
arguments (RabbitMQ 4.x's x-mqtt-subscription-opts), so that a persistent session's subscriptions, options and all,
are read back from its queue's bindings when a connection takes it up, after a restart too."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Final

from pamqp import commands as spec

from broker.connection.mqtt import topics
from broker.connection.mqtt.expiry import MAX_SESSION_EXPIRY
from protocol import mqtt
from protocol.errors import AMQPError

if TYPE_CHECKING:
    from broker.connection.mqtt.connection import MqttConnection
    from broker.model.queue import Queue

QUEUE_PREFIX: Final = "mqtt-subscription-"  # the session queues: QUEUE_PREFIX + client id + "qos0" or "qos1"
SHARED_PREFIX: Final = "mqtt-shared-"  # a shared subscription's queue: SHARED_PREFIX + group + "/" + filter
SHARE: Final = "$share/"  # how a shared subscription's filter begins
CONSUMER_TAGS: Final = (b"mqtt-qos0", b"mqtt-qos1")  # the consumer of each session queue
SHARED_TAGS: Final = (b"mqtt-share0:", b"mqtt-share1:")  # before a shared queue's name in its consumer's tag
SHARED_TAG_PREFIX: Final = b"mqtt-share"
MAX_SHARED: Final = 1_000  # shared subscriptions of one connection: their consumers' prefetches stay within packet ids
OPTIONS: Final = "x-mqtt-subscription-opts"  # the binding argument that holds a 5.0 subscription's options


def queue_name(client_id: str, qos: int) -> str:
    return f"{QUEUE_PREFIX}{client_id}qos{qos}"


def qos_of_consumer(consumer_tag: bytes) -> int:
    """The QoS of the subscription whose consumer delivered a message."""
    return 1 if consumer_tag == CONSUMER_TAGS[1] or consumer_tag.startswith(SHARED_TAGS[1]) else 0


def _inner(topic_filter: str) -> str:
    """The filter a subscription matches topics by (a shared one's, without $share/<group>/)."""
    shared = _shared(topic_filter)
    return shared[1] if shared is not None else topic_filter


def _shared(topic_filter: str) -> tuple[str, str] | None:
    """(group, filter) of a shared subscription's filter, or None for another."""
    if not topic_filter.startswith(SHARE):
        return None
    group, _, inner = topic_filter[len(SHARE):].partition("/")
    return group, inner


class Subscriptions:
    """A connection's subscriptions, made and undone through its channel (MqttConnection.send_method)."""

    def __init__(self, connection: "MqttConnection"):
        self.connection = connection
        self.filters: dict[str, int] = {}  # topic filter (shared ones whole) -> its QoS
        self.identifiers: dict[str, int] = {}  # 5.0: topic filter (a shared one's inner filter) -> its identifier
        self.as_published: set[str] = set()  # 5.0: the filters whose messages keep the retain flag they came with
        self.no_local: set[str] = set()  # 5.0: the filters that take no message this client published
        # unshared filter -> (the QoS of the session queue it binds, that binding's arguments)
        self.bound: dict[str, tuple[int, dict]] = {}
        self.bound_by_key: dict[str, str] = {}  # the binding key of each filter in bound -> that filter
        self.consuming = [False, False]  # whether the session queue of QoS 0 / 1 is consumed

    # --- subscribe -----------------------------------------------------------------------------------------------
    def subscribe(self, packet: mqtt.Subscribe) -> None:
        """Make each subscription, then SUBACK with each one's granted QoS or refusal, then the retained messages
        the new subscriptions match."""
        connection = self.connection
        v5 = connection.level == mqtt.MQTT_5
        codes: list[int] = [mqtt.UNSPECIFIED_ERROR] * len(packet.subscriptions)
        granted: list[tuple[str, int]] = []
        identifier = (packet.properties.get("subscription_identifier") or [0])[0]
        steps = Countdown(lambda: connection.subscribed(packet.packet_id, codes, granted))
        for index, subscription in enumerate(packet.subscriptions):
            topic_filter = self._known(subscription.topic_filter)
            shared = _shared(topic_filter) if v5 else None
            code, problem = self._problem(topic_filter, shared, v5)
            if problem is not None:
                codes[index] = code
                connection.log_refusal(topic_filter, problem)
                continue
            qos = min(subscription.qos, 1)
            step = steps.step()

            def made(index=index, topic_filter=topic_filter, qos=qos, step=step, shared=shared,
                     retain_handling=subscription.retain_handling,
                     as_published=subscription.retain_as_published, no_local=subscription.no_local) -> None:
                new = topic_filter not in self.filters
                self.filters[topic_filter] = qos
                if identifier:
                    self.identifiers[topic_filter] = identifier
                else:
                    self.identifiers.pop(topic_filter, None)
                if as_published:
                    self.as_published.add(topic_filter)
                else:
                    self.as_published.discard(topic_filter)
                if no_local and shared is None:  # (the spec forbids it on a shared subscription: not kept there)
                    self.no_local.add(topic_filter)
                else:
                    self.no_local.discard(topic_filter)
                codes[index] = qos
                # (a shared subscription gets no retained messages, as the spec says)
                if shared is None and (retain_handling == 0 or (retain_handling == 1 and new)):
                    granted.append((topic_filter, qos))
                step()

            def refused(error: AMQPError, index=index, step=step, topic_filter=topic_filter) -> None:
                connection.log_refusal(topic_filter, error.reply_text)
                codes[index] = mqtt.NOT_AUTHORIZED if v5 else mqtt.UNSPECIFIED_ERROR
                step()

            if shared is not None:
                if topic_filter not in self.filters and sum(map(_is_shared, self.filters)) >= MAX_SHARED:
                    connection.log_refusal(topic_filter, f"more than {MAX_SHARED} shared subscriptions")
                    codes[index] = mqtt.QUOTA_EXCEEDED if v5 else mqtt.UNSPECIFIED_ERROR
                    step()
                    continue
                self._share(shared, topic_filter, qos, made, refused)
            else:
                arguments = _arguments(qos, identifier, subscription.no_local, subscription.retain_as_published) \
                    if v5 else {}
                self._bind(topic_filter, qos, arguments, made, refused)
        steps.start()

    def _problem(self, topic_filter: str, shared: tuple[str, str] | None, v5: bool) -> tuple[int, str | None]:
        """(the refusal's reason code, why) for a filter that cannot be subscribed; (0, None) for one that can."""
        invalid = mqtt.TOPIC_FILTER_INVALID if v5 else mqtt.UNSPECIFIED_ERROR
        if shared is not None:
            group, inner = shared
            if not group or "+" in group or "#" in group or not inner:
                return invalid, "a shared subscription is $share/<group>/<filter>, the group without wildcards"
            problem = mqtt.topic_filter_problem(inner)
            if problem is None and len(f"{SHARED_PREFIX}{group}/{inner}".encode()) > 255 - len(SHARED_TAGS[1]):
                problem = "the shared subscription's queue name would be longer than 255 bytes"
        else:
            problem = mqtt.topic_filter_problem(topic_filter)
            inner = topic_filter
        if problem is None and len(topics.binding_key(inner).encode()) > 255:
            problem = "the topic filter is longer than the 255 bytes of a binding key"
        return (invalid, problem) if problem is not None else (0, None)

    def _bind(self, topic_filter: str, qos: int, arguments: dict, made: Callable[[], None],
              refused: Callable[[AMQPError], None]) -> None:
        """Bind the session queue of qos to the filter's key with the subscription's options, after it is declared
        and consumed; the filter's earlier binding goes (a subscription made again replaces the first, as RabbitMQ
        4.x does)."""
        connection = self.connection
        key = topics.binding_key(topic_filter)
        exchange = connection.config.mqtt_exchange
        earlier = self.bound.get(topic_filter)
        if earlier is not None and earlier != (qos, arguments):
            self._unbind(topic_filter, _nothing, _ignored)

        def bound() -> None:
            self.bound[topic_filter] = (qos, arguments)
            self.bound_by_key[key] = topic_filter
            made()

        self.ensure_queue(qos, lambda: connection.send_method(
            spec.Queue.Bind(queue=self.queue_name(qos), exchange=exchange, routing_key=key, arguments=arguments),
            bound, refused), refused)

    def _unbind(self, topic_filter: str, done: Callable[[], None], refused: Callable[[AMQPError], None]) -> None:
        """Undo the filter's binding of its session queue (done at once if it has none)."""
        earlier = self.bound.pop(topic_filter, None)
        if earlier is None:
            done()
            return
        del self.bound_by_key[topics.binding_key(topic_filter)]
        qos, arguments = earlier
        self.connection.send_method(spec.Queue.Unbind(
            queue=self.queue_name(qos), exchange=self.connection.config.mqtt_exchange,
            routing_key=topics.binding_key(topic_filter), arguments=arguments), done, refused)

    def _known(self, topic_filter: str) -> str:
        """The filter as the session knows it: one read back from a binding key (resume) may write "/" where the
        client wrote ".", which is the same separator."""
        if topic_filter in self.filters or topic_filter.startswith(SHARE):
            return topic_filter
        return self.bound_by_key.get(topics.binding_key(topic_filter), topic_filter)

    def resume(self, queue: "Queue") -> None:
        """A persistent session taken up: its subscriptions are its QoS 1 queue's bindings of the MQTT exchange,
        their options in their arguments."""
        exchange = self.connection.config.mqtt_exchange
        for binding in queue.bindings:
            if binding.source.name != exchange:
                continue
            topic_filter = topics.topic_filter(binding.routing_key)
            options = binding.arguments.get(OPTIONS)
            options = options if isinstance(options, dict) else {}
            self.filters[topic_filter] = 1
            self.bound[topic_filter] = (1, binding.arguments)
            self.bound_by_key[topics.binding_key(topic_filter)] = topic_filter
            if identifier := options.get("id"):
                self.identifiers[topic_filter] = identifier
            if options.get("no-local"):
                self.no_local.add(topic_filter)
            if options.get("retain-as-published"):
                self.as_published.add(topic_filter)

    def ensure_queue(self, qos: int, then: Callable[[], None], refused: Callable[[AMQPError], None],
                     resumed: bool = False) -> None:
        """Declare the session queue of qos and consume it, once per connection: QoS 0's never outlives the
        connection, QoS 1's does in a persistent session (durable, for its session expiry; 3.1.1: a day, RabbitMQ's
        subscription_ttl). In a clean session it is transient too, as the session ends with the connection (RabbitMQ
        makes it durable: its declare would wait for the disk, and the SUBACK with it, for nothing). A session
        resumed keeps its queue as it is (resumed: declared passively)."""
        if self.consuming[qos]:
            then()
            return
        connection = self.connection
        name = self.queue_name(qos)
        if resumed:
            declare = spec.Queue.Declare(queue=name, passive=True)
        elif qos == 0 or not connection.session_expiry:
            declare = spec.Queue.Declare(queue=name, durable=False, auto_delete=True)
        else:  # (the session's own expiry, which a DISCONNECT may change, is timed by the server: SessionExpiry)
            declare = spec.Queue.Declare(queue=name, durable=True, arguments={"x-expires": MAX_SESSION_EXPIRY * 1000})

        # Both go at once (the channel takes them in order): a subscription made meanwhile binds the queue the
        # declare makes. Should either be refused, the subscription is, once, and the next one tries again.
        self.consuming[qos] = True
        told: list[AMQPError] = []

        def failed(error: AMQPError) -> None:
            self.consuming[qos] = False
            if not told:
                told.append(error)
                refused(error)

        connection.send_method(declare, _nothing, failed)
        connection.send_method(spec.Basic.Consume(queue=name, consumer_tag=CONSUMER_TAGS[qos].decode(),
                                                  no_ack=qos == 0), then, failed)

    def _share(self, shared: tuple[str, str], topic_filter: str, qos: int, made: Callable[[], None],
               refused: Callable[[AMQPError], None]) -> None:
        """Join a group's shared subscription: its queue (gone with its last member) bound to the filter, and a
        consumer of this connection's on it. Made again with another QoS, the consumer is made again."""
        connection = self.connection
        group, inner = shared
        name = f"{SHARED_PREFIX}{group}/{inner}"
        exchange = connection.config.mqtt_exchange
        earlier = self.filters.get(topic_filter)
        if earlier is not None:
            if earlier == qos:
                made()
                return
            connection.send_method(spec.Basic.Cancel(consumer_tag=(SHARED_TAGS[earlier] + name.encode()).decode()),
                                   _nothing, _ignored)

        def declared() -> None:
            connection.send_method(spec.Queue.Bind(queue=name, exchange=exchange,
                                                   routing_key=topics.binding_key(inner)), bound, refused)

        def bound() -> None:
            connection.send_method(spec.Basic.Consume(queue=name, consumer_tag=(SHARED_TAGS[qos] + name.encode())
                                                      .decode(), no_ack=qos == 0), made, refused)

        connection.send_method(spec.Queue.Declare(queue=name, durable=True, auto_delete=True), declared, refused)

    # --- unsubscribe ---------------------------------------------------------------------------------------------
    def unsubscribe(self, packet: mqtt.Unsubscribe) -> None:
        connection = self.connection
        codes = [mqtt.SUCCESS] * len(packet.topic_filters)
        steps = Countdown(lambda: connection.send(mqtt.unsuback(packet.packet_id, codes, connection.level)))
        for index, given in enumerate(packet.topic_filters):
            topic_filter = self._known(given)
            qos = self.filters.pop(topic_filter, None)
            if qos is None:
                codes[index] = mqtt.NO_SUBSCRIPTION_EXISTED
            shared = _shared(topic_filter) if connection.level == mqtt.MQTT_5 else None
            self.identifiers.pop(topic_filter, None)
            self.as_published.discard(topic_filter)
            self.no_local.discard(topic_filter)
            if shared is not None:
                if qos is not None:
                    step = steps.step()
                    tag = SHARED_TAGS[qos] + f"{SHARED_PREFIX}{shared[0]}/{shared[1]}".encode()
                    connection.send_method(spec.Basic.Cancel(consumer_tag=tag.decode()), step, _anyway(step))
                continue
            step = steps.step()
            self._unbind(topic_filter, step, _anyway(step))
        steps.start()

    # --- what deliveries need ------------------------------------------------------------------------------------
    def identifiers_for(self, topic: str) -> list[int]:
        """5.0: the identifiers of the subscriptions that the topic matches (one delivery carries them all)."""
        return sorted({identifier for topic_filter, identifier in self.identifiers.items()
                       if topics.matches(_inner(topic_filter), topic)})

    def reaches(self, topic: str) -> bool:
        """Whether a subscription matches a topic that begins with "$" as the spec says: not by a filter that
        begins with a wildcard (the topic exchange's binding of such a filter matches it all the same)."""
        for topic_filter in self.filters:
            shared = _shared(topic_filter) if topic_filter.startswith(SHARE) else None
            inner = shared[1] if shared is not None else topic_filter
            if not inner.startswith(("+", "#")) and topics.matches(inner, topic):
                return True
        return False

    def only_no_local(self, topic: str) -> bool:
        """5.0: whether every (unshared) subscription that the topic matches takes no message of this client's
        own."""
        return all(topic_filter in self.no_local for topic_filter in self.filters
                   if not topic_filter.startswith(SHARE) and topics.matches(topic_filter, topic)) and any(
            topics.matches(topic_filter, topic) for topic_filter in self.no_local)

    def keeps_retain_flag(self, topic: str) -> bool:
        """5.0: whether a subscription that the topic matches asked for messages as published (retain flag kept)."""
        return any(topics.matches(_inner(topic_filter), topic) for topic_filter in self.as_published)

    def queue_name(self, qos: int) -> str:
        return queue_name(self.connection.client_id, qos)


class Countdown:
    """Calls done() once every step it handed out was taken, and start() was called."""

    def __init__(self, done: Callable[[], None]):
        self.done = done
        self.left = 1  # (start's own)

    def step(self) -> Callable[[], None]:
        self.left += 1
        return self._taken

    def start(self) -> None:
        self._taken()

    def _taken(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.done()


def _arguments(qos: int, identifier: int, no_local: bool, as_published: bool) -> dict:
    """A 5.0 subscription's binding arguments: its options, as RabbitMQ 4.x keeps them."""
    return {OPTIONS: {"id": identifier, "no-local": no_local, "retain-as-published": as_published, "qos": qos}}


def _is_shared(topic_filter: str) -> bool:
    return topic_filter.startswith(SHARE)


def _nothing() -> None:
    pass


def _ignored(error: AMQPError) -> None:
    pass


def _anyway(step: Callable[[], None]) -> Callable[[AMQPError], None]:
    """A refusal that counts as the step done (an unsubscribe is answered whatever its unbinding met)."""
    return lambda error: step()
