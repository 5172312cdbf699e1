"""The Prometheus endpoint (its own listener, as RabbitMQ's rabbitmq_prometheus plugin on 15692): ``/metrics`` with
the node's totals and ``/metrics/per-object`` with a series per queue, under RabbitMQ's metric names and labels so
that its Grafana dashboards work, plus Warren's own (store batches and fsync time, store size, recovery).

A scrape reads the broker in two steps: on the event loop, the numbers are copied queue by queue, letting other
work run every SLICE seconds (as the rates sampler does); then a worker thread turns the copy into the text format
(prometheus_client), which is where the time of a large scrape goes. Scrapes that arrive while a rendering of
their endpoint is under way share it, and a scrape's text is written a piece per turn of the event loop."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import resource
import threading
import time
from dataclasses import dataclass, field
from collections.abc import Iterator
from typing import TYPE_CHECKING, NamedTuple

from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.core import (
    CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, UnknownMetricFamily,
)
from prometheus_client.utils import floatToGoString

from broker.connection.alarms.disk import free_bytes
from broker.connection.alarms.memory import resident_bytes
from broker.management import http
from broker.management.rates import SLICE
from broker.management.resources import QueueCounts, queue_counts
from broker.management.views.nodes import open_files
from broker.model.counters import AMQP_LABEL, QUEUE_COUNTERS
from broker.model.definitions import RABBITMQ_VERSION

if TYPE_CHECKING:
    from broker.connection.server import Server
    from storage.histogram import Histogram

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # the text format generate_latest writes, as RabbitMQ's
PROTOCOL = [AMQP_LABEL]  # the protocol label of RabbitMQ's global queue counters (messages of every protocol)


# Warren's queue types under RabbitMQ's names (the queue_type label); streams are listed with zeros, as RabbitMQ
# lists every type it knows.
QUEUE_TYPES = {"classic": "rabbit_classic_queue", "quorum": "rabbit_quorum_queue", "stream": "rabbit_stream_queue"}
DEAD_LETTER_REASONS = ("expired", "rejected", "maxlen", "delivery_limit")


class QueueSample(NamedTuple):
    vhost: str
    name: str
    counts: QueueCounts
    consumers: int
    counters: tuple[int, ...]  # the queue's QUEUE_COUNTERS, in that order


@dataclass
class Snapshot:
    """What a scrape reports, copied off the broker's objects on the event loop."""

    server: "Server"
    queues: list[QueueSample] = field(default_factory=list)
    connections: int = 0
    channels: int = 0
    consumers: int = 0
    # (channel's name, its consumers) of every channel: taken for the per-object endpoint only
    channel_consumers: list[tuple[str, int]] = field(default_factory=list)
    publishers: int = 0
    counters: dict[str, int] = field(default_factory=dict)  # NodeCounters' plain counters, summed over protocols
    # protocol label -> its NodeCounters' plain counters (RabbitMQ's global counters are labelled by protocol)
    protocols: dict[str, dict[str, int]] = field(default_factory=dict)
    # protocol label -> (its publishing channels, its consumers)
    clients: dict[str, tuple[int, int]] = field(default_factory=dict)
    # queue type -> QUEUE_COUNTERS summed over its queues, live and deleted
    queue_counters: dict[str, dict[str, int]] = field(default_factory=dict)
    dead_lettered: dict[tuple[str, str, str], int] = field(default_factory=dict)
    store: dict = field(default_factory=dict)  # storage.store.MessageStore.stats()
    resident_bytes: int = 0
    disk_free: int = 0
    open_files: int = 0


async def take_snapshot(server: "Server", per_object: bool) -> Snapshot:
    """Copy the numbers a scrape needs (those of each channel when per_object), yielding to the event loop every
    SLICE seconds."""
    snapshot = Snapshot(server)
    connections = [connection for connection in server.connections if connection.vhost is not None]
    channels = [channel for connection in connections for channel in connection.channels.values()]
    snapshot.connections, snapshot.channels = len(connections), len(channels)
    snapshot.consumers = sum(len(channel.consumers) for channel in channels)
    if per_object:
        snapshot.channel_consumers = [(http.channel_name(channel), len(channel.consumers)) for channel in channels]
    snapshot.publishers = sum(channel.publish_count > 0 for channel in channels)
    counters = server.node.counters
    plain = [name for name in counters.__slots__ if isinstance(getattr(counters, name), int)]
    snapshot.protocols = {label: {name: getattr(of, name) for name in plain}
                          for label, of in server.node.by_protocol()}
    snapshot.counters = {name: sum(values[name] for values in snapshot.protocols.values()) for name in plain}
    for connection in connections:  # (publishers and consumers by protocol, as RabbitMQ's global gauges)
        label = connection.protocol_label
        publishing, consuming = snapshot.clients.get(label, (0, 0))
        snapshot.clients[label] = (
            publishing + sum(channel.publish_count > 0 for channel in connection.channels.values()),
            consuming + sum(len(channel.consumers) for channel in connection.channels.values()))
    snapshot.dead_lettered = dict(counters.dead_lettered)
    sums = snapshot.queue_counters
    for queue_type in QUEUE_TYPES:
        deleted = counters.deleted_queues.get(queue_type)
        sums[queue_type] = dict(deleted) if deleted else dict.fromkeys(QUEUE_COUNTERS, 0)
    started = time.perf_counter()
    # Each queue is counted once: by the process that owns it where every process serves every vhost's clients
    # ([server] spread_vhosts: its own clients' deliveries and acks, and every message that reached it); else by the
    # process that serves its vhost, whose clients do all that is counted (a stand-in's counts are its owner's)
    by_owner = server.config.spread_vhosts
    for vhost in list(server.node.vhosts.values()):
        if vhost.home is not None and not by_owner:  # (its queues here are owned for another process, which counts)
            continue
        for queue in list(vhost.queues.values()):
            if queue.deleted or (by_owner and queue.owner is not None):
                continue
            values = tuple(getattr(queue, name) for name in QUEUE_COUNTERS)
            snapshot.queues.append(QueueSample(vhost.name, queue.name, queue_counts(queue),
                                               len(queue.consumers), values))
            type_sums = sums[queue.queue_type]
            for name, value in zip(QUEUE_COUNTERS, values):
                type_sums[name] += value
            if time.perf_counter() - started > SLICE:
                await asyncio.sleep(0)
                started = time.perf_counter()
    snapshot.store = server.store.stats()
    snapshot.resident_bytes = resident_bytes()
    snapshot.disk_free = free_bytes(server.data_dir) or 0
    snapshot.open_files = open_files()
    return snapshot


# --- the families ------------------------------------------------------------------------------------------------
def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=value)


PUBLISHED = QUEUE_COUNTERS.index("published")

# (family type, name, help, how a QueueSample gives the value): RabbitMQ's queue metrics
GAUGE, COUNTER = GaugeMetricFamily, CounterMetricFamily
QUEUE_METRICS = (
    (GAUGE, "rabbitmq_queue_messages_ready", "Messages ready to be delivered to consumers",
     lambda q: q.counts.ready),
    (GAUGE, "rabbitmq_queue_messages_unacked", "Messages delivered to consumers but not yet acknowledged",
     lambda q: q.counts.unacked),
    (GAUGE, "rabbitmq_queue_messages", "Sum of ready and unacknowledged messages - total queue depth",
     lambda q: q.counts.ready + q.counts.unacked),
    (GAUGE, "rabbitmq_queue_consumers", "Consumers on a queue", lambda q: q.consumers),
    (GAUGE, "rabbitmq_queue_messages_ram", "Ready and unacknowledged messages stored in memory",
     lambda q: q.counts.ready - q.counts.paged + q.counts.unacked),
    (GAUGE, "rabbitmq_queue_messages_ram_bytes", "Size of ready and unacknowledged messages stored in memory",
     lambda q: q.counts.ready_bytes - q.counts.paged_bytes + q.counts.unacked_bytes),
    (GAUGE, "rabbitmq_queue_messages_ready_ram", "Ready messages stored in memory",
     lambda q: q.counts.ready - q.counts.paged),
    (GAUGE, "rabbitmq_queue_messages_unacked_ram", "Unacknowledged messages stored in memory",
     lambda q: q.counts.unacked),
    (GAUGE, "rabbitmq_queue_messages_persistent", "Persistent messages", lambda q: q.counts.persistent),
    (GAUGE, "rabbitmq_queue_messages_persistent_bytes", "Size in bytes of persistent messages",
     lambda q: q.counts.persistent_bytes),
    (GAUGE, "rabbitmq_queue_messages_bytes", "Size in bytes of ready and unacknowledged messages",
     lambda q: q.counts.ready_bytes + q.counts.unacked_bytes),
    (GAUGE, "rabbitmq_queue_messages_ready_bytes", "Size in bytes of ready messages", lambda q: q.counts.ready_bytes),
    (GAUGE, "rabbitmq_queue_messages_unacked_bytes", "Size in bytes of all unacknowledged messages",
     lambda q: q.counts.unacked_bytes),
    (GAUGE, "rabbitmq_queue_messages_paged_out", "Messages paged out to disk", lambda q: q.counts.paged),
    (GAUGE, "rabbitmq_queue_messages_paged_out_bytes", "Size in bytes of messages paged out to disk",
     lambda q: q.counts.paged_bytes),
    (COUNTER, "rabbitmq_queue_messages_published_total", "Total number of messages published to queues",
     lambda q: q.counters[PUBLISHED]),
)

# (RabbitMQ's global counter, its help, the QUEUE_COUNTERS it sums) per queue type
GLOBAL_QUEUE_COUNTERS = (
    ("rabbitmq_global_messages_delivered_total", "Total number of messages delivered to consumers",
     ("delivered_consume_manual_ack", "delivered_consume_auto_ack", "delivered_get_manual_ack",
      "delivered_get_auto_ack")),
    ("rabbitmq_global_messages_delivered_consume_manual_ack_total", "Total number of messages delivered to "
     "consumers using basic.consume with manual acknowledgment", ("delivered_consume_manual_ack",)),
    ("rabbitmq_global_messages_delivered_consume_auto_ack_total", "Total number of messages delivered to consumers "
     "using basic.consume with automatic acknowledgment", ("delivered_consume_auto_ack",)),
    ("rabbitmq_global_messages_delivered_get_manual_ack_total", "Total number of messages delivered to consumers "
     "using basic.get with manual acknowledgment", ("delivered_get_manual_ack",)),
    ("rabbitmq_global_messages_delivered_get_auto_ack_total", "Total number of messages delivered to consumers "
     "using basic.get with automatic acknowledgment", ("delivered_get_auto_ack",)),
    ("rabbitmq_global_messages_get_empty_total", "Total number of times basic.get operations fetched no message",
     ("get_empty",)),
    ("rabbitmq_global_messages_redelivered_total", "Total number of messages redelivered to consumers",
     ("redelivered",)),
    ("rabbitmq_global_messages_acknowledged_total", "Total number of messages acknowledged by consumers",
     ("acknowledged",)),
)
# (RabbitMQ's global counter, its help, the NodeCounters field)
GLOBAL_COUNTERS = (
    ("rabbitmq_global_messages_received_total", "Total number of messages received from publishers", "received"),
    ("rabbitmq_global_messages_received_confirm_total", "Total number of messages received from publishers "
     "expecting confirmations", "received_confirm"),
    ("rabbitmq_global_messages_routed_total", "Total number of messages routed to queues or streams", "routed"),
    ("rabbitmq_global_messages_unroutable_dropped_total", "Total number of messages published as non-mandatory "
     "into an exchange and dropped as unroutable", "unroutable_dropped"),
    ("rabbitmq_global_messages_unroutable_returned_total", "Total number of messages published as mandatory into "
     "an exchange and returned to the publisher as unroutable", "unroutable_returned"),
    ("rabbitmq_global_messages_confirmed_total", "Total number of messages confirmed to publishers", "confirmed"),
)
NODE_COUNTERS = (
    ("rabbitmq_connections_opened_total", "Total number of connections opened", "connections_opened"),
    ("rabbitmq_connections_closed_total", "Total number of connections closed or terminated", "connections_closed"),
    ("rabbitmq_channels_opened_total", "Total number of channels opened", "channels_opened"),
    ("rabbitmq_channels_closed_total", "Total number of channels closed", "channels_closed"),
    ("rabbitmq_queues_declared_total", "Total number of queues declared", "queues_declared"),
    ("rabbitmq_queues_created_total", "Total number of queues created", "queues_created"),
    ("rabbitmq_queues_deleted_total", "Total number of queues deleted", "queues_deleted"),
)


def families(snapshot: Snapshot, per_object: bool) -> Iterator:
    """The metric families of a scrape, one at a time (each is formatted and let go before the next is made), the
    queue metrics per queue (labels vhost and queue, already as text) when per_object, else summed."""
    server = snapshot.server
    counters = snapshot.counters
    yield _identity(server.config.cluster_name)
    build = UnknownMetricFamily("rabbitmq_build_info", "RabbitMQ & Erlang/OTP version info",
                                labels=["rabbitmq_version", "prometheus_plugin_version", "prometheus_client_version",
                                        "erlang_version", "product_name", "product_version"])
    build.add_metric([RABBITMQ_VERSION, RABBITMQ_VERSION, "", "", http.PRODUCT_NAME, server.version], 1)
    yield build
    for resource_name, alarm, documentation in (
            ("file_descriptor_limit", None, "is 1 if file descriptor limit alarm is in effect"),
            ("free_disk_space_watermark", "disk", "is 1 if free disk space watermark alarm is in effect"),
            ("memory_used_watermark", "memory", "is 1 if VM memory watermark alarm is in effect")):
        family = UnknownMetricFamily(f"rabbitmq_alarms_{resource_name}", documentation)
        family.add_metric([], int(alarm in server.alarms))
        yield family
    yield from [_counter(name, documentation, counters[key]) for name, documentation, key in NODE_COUNTERS]
    file_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    yield from [
        _gauge("rabbitmq_process_open_fds", "Open file descriptors", snapshot.open_files),
        _gauge("rabbitmq_process_open_tcp_sockets", "Open TCP sockets", len(server.connections)),
        _gauge("rabbitmq_process_resident_memory_bytes", "Memory used in bytes", snapshot.resident_bytes),
        _gauge("rabbitmq_disk_space_available_bytes", "Disk space available in bytes", snapshot.disk_free),
        _gauge("rabbitmq_process_max_fds", "Open file descriptors limit", file_limit),
        _gauge("rabbitmq_process_max_tcp_sockets", "Open TCP sockets limit", file_limit),
        _gauge("rabbitmq_resident_memory_limit_bytes", "Memory high watermark in bytes", server.memory_alarm.limit),
        _gauge("rabbitmq_disk_space_available_limit_bytes", "Free disk space low watermark in bytes", 0),
        _gauge("rabbitmq_erlang_uptime_seconds", "Node uptime", time.time() - server.started_at),
    ]
    for name, documentation, value_of in (
            ("rabbitmq_auth_attempts_total", "Total number of authorization attempts",
             lambda values: values["auth_attempts"]),
            ("rabbitmq_auth_attempts_succeeded_total", "Total number of successful authentication attempts",
             lambda values: values["auth_attempts"] - values["auth_failed"]),
            ("rabbitmq_auth_attempts_failed_total", "Total number of failed authentication attempts",
             lambda values: values["auth_failed"])):
        family = CounterMetricFamily(name, documentation, labels=["protocol"])
        for label, values in snapshot.protocols.items():
            family.add_metric([label], value_of(values))
        yield family
    yield from _queue_families(snapshot.queues, per_object)
    yield _channel_consumers(snapshot, per_object)
    yield from [
        _gauge("rabbitmq_connections", "Connections currently open", snapshot.connections),
        _gauge("rabbitmq_channels", "Channels currently open", snapshot.channels),
        _gauge("rabbitmq_consumers", "Consumers currently connected", snapshot.consumers),
        _gauge("rabbitmq_queues", "Queues available", len(snapshot.queues)),
    ]
    yield from _global_families(snapshot)
    yield from _warren_families(snapshot)


def identity_only(node: str, cluster: str) -> bytes:
    """The text of a node none of whose workers leads a group (a cluster's follower): its identity alone, so that a
    scrape of every node finds each one up, and each queue is reported once, by the node that leads it."""
    return generate_latest(_Collected(iter((_identity(cluster, node),))))


def _identity(cluster: str, node: str | None = None) -> UnknownMetricFamily:
    """The labels RabbitMQ's dashboards join every series on (node: this process's node name unless given). The
    permanent cluster id is derived from the cluster name, so that it stays the same across restarts."""
    family = UnknownMetricFamily("rabbitmq_identity_info", "RabbitMQ node & cluster identity info",
                                 labels=["rabbitmq_node", "rabbitmq_cluster", "rabbitmq_cluster_permanent_id"])
    permanent_id = "warren-cluster-id-" + hashlib.sha256(cluster.encode()).hexdigest()[:22]
    family.add_metric([node or http.node_name(), cluster, permanent_id], 1)
    return family


def _queue_families(queues: list[QueueSample], per_object: bool) -> Iterator:
    """The queue metrics: summed as families, or per queue as text written here. generate_latest formats every
    sample's labels afresh (sorting, escaping), which for 10,000 queues is most of a second of holding the
    interpreter lock beside the event loop; a queue's labels are the same in all its series, so they are written
    once."""
    if not per_object:
        for family_type, name, documentation, value_of in QUEUE_METRICS:
            yield family_type(name, documentation, value=sum(value_of(queue) for queue in queues))
        return
    labels = [f'{{vhost="{_label_value(queue.vhost)}",queue="{_label_value(queue.name)}"}} ' for queue in queues]
    for family_type, name, documentation, value_of in QUEUE_METRICS:
        kind = "counter" if family_type is COUNTER else "gauge"
        lines = [f"# HELP {name} {documentation}\n# TYPE {name} {kind}\n"]
        lines.extend(f"{name}{label}{floatToGoString(value_of(queue))}\n" for label, queue in zip(labels, queues))
        yield "".join(lines).encode()


def _channel_consumers(snapshot: Snapshot, per_object: bool) -> GaugeMetricFamily:
    """RabbitMQ's rabbitmq_channel_consumers (on its Grafana dashboard): summed over the channels, or one series per
    channel labelled with its name (RabbitMQ's label is the channel process's id; Warren's channels have none, and
    the name is what its management API shows)."""
    name, documentation = "rabbitmq_channel_consumers", "Consumers on a channel"
    if not per_object:
        return GaugeMetricFamily(name, documentation, value=snapshot.consumers)
    family = GaugeMetricFamily(name, documentation, labels=["channel"])
    for channel, consumers in snapshot.channel_consumers:
        family.add_metric([channel], consumers)
    return family


def _label_value(text: str) -> str:
    """A label value escaped as the text format asks (as generate_latest does)."""
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def _global_families(snapshot: Snapshot) -> list:
    consumers = GaugeMetricFamily("rabbitmq_global_consumers", "Current number of consumers", labels=["protocol"])
    publishers = GaugeMetricFamily("rabbitmq_global_publishers", "Current number of publishers", labels=["protocol"])
    for label in snapshot.protocols:
        publishing, consuming = snapshot.clients.get(label, (0, 0))
        consumers.add_metric([label], consuming)
        publishers.add_metric([label], publishing)
    result = [consumers, publishers]
    for name, documentation, key in GLOBAL_COUNTERS:
        family = CounterMetricFamily(name, documentation, labels=["protocol"])
        for label, values in snapshot.protocols.items():
            family.add_metric([label], values[key])
        result.append(family)
    for name, documentation, keys in GLOBAL_QUEUE_COUNTERS:
        family = CounterMetricFamily(name, documentation, labels=["protocol", "queue_type"])
        for queue_type, label in QUEUE_TYPES.items():
            sums = snapshot.queue_counters[queue_type]
            family.add_metric([*PROTOCOL, label], sum(sums[key] for key in keys))
        result.append(family)
    for reason in DEAD_LETTER_REASONS:
        family = CounterMetricFamily(f"rabbitmq_global_messages_dead_lettered_{reason}_total",
                                     f"Total number of messages dead-lettered due to {reason}",
                                     labels=["queue_type", "dead_letter_strategy"])
        for queue_type in ("classic", "quorum"):
            for strategy in ("at_most_once", "disabled"):
                family.add_metric([QUEUE_TYPES[queue_type], strategy],
                                  snapshot.dead_lettered.get((reason, queue_type, strategy), 0))
        result.append(family)
    return result


def _histogram(name: str, documentation: str, histogram: "Histogram") -> HistogramMetricFamily:
    buckets = [("+Inf" if bound == float("inf") else repr(bound), count) for bound, count in histogram.cumulative()]
    return HistogramMetricFamily(name, documentation, buckets=buckets, sum_value=histogram.sum)


def _warren_families(snapshot: Snapshot) -> list:
    """Warren's own: the message store's group commit and size, and the last recovery."""
    store = snapshot.store
    report = snapshot.server.recovery_report
    return [
        _histogram("warren_store_batch_messages", "Messages written per store batch (one group commit)",
                   store["batch_messages"]),
        _histogram("warren_store_sync_seconds", "Time the fdatasync calls of a store batch took",
                   store["sync_seconds"]),
        _counter("warren_store_batches_total", "Store batches written", store["batches"]),
        _counter("warren_store_fsyncs_total", "fdatasync and fsync calls made for store batches", store["fsyncs"]),
        _counter("warren_store_written_bytes_total", "Bytes written to the message store", store["bytes_written"]),
        _gauge("warren_store_bytes", "Bytes of the message store on disk (segments and definitions log)",
               store["bytes_on_disk"]),
        _gauge("warren_store_segments", "Segment files of the message store", store["segments"]),
        _gauge("warren_store_healthy", "1 while durable writes succeed, 0 while they fail", int(store["healthy"])),
        _gauge("warren_recovery_seconds", "Seconds the last start took to read the store and rebuild every queue",
               snapshot.server.recovery_seconds),
        _gauge("warren_recovery_messages", "Messages the last start recovered", report.get("messages", 0)),
        _gauge("warren_recovery_torn_tail_bytes", "Bytes of torn tails the last start cut off",
               report.get("torn_tail_bytes", 0)),
    ]


class _Collected:
    """What prometheus_client's generate_latest reads: an object whose collect() gives the families."""

    def __init__(self, metric_families: Iterator):
        self.metric_families = metric_families

    def collect(self):
        return self.metric_families


_formatting = threading.Lock()  # one scrape formats at a time


def exposition(snapshot: Snapshot, per_object: bool) -> bytes:
    """The text format of a scrape (run on a worker thread). The cyclic garbage collector is paused meanwhile: the
    scrape makes millions of short-lived objects (none in cycles), which would otherwise set off full collections
    of the whole heap, each holding the event loop up for as long as it takes. Families are made one at a time, so
    that the scrape's memory stays that of one family."""
    with _formatting:
        collecting = gc.isenabled()
        gc.disable()
        try:
            return b"".join(family if isinstance(family, bytes) else generate_latest(_Collected((family,)))
                            for family in families(snapshot, per_object))
        finally:
            if collecting:
                gc.enable()


async def render(server: "Server", per_object: bool) -> bytes:
    """One scrape's text: the snapshot on the event loop, the formatting on a worker thread."""
    snapshot = await take_snapshot(server, per_object)
    return await asyncio.get_running_loop().run_in_executor(None, exposition, snapshot, per_object)


class SharedRenders:
    """The rendering under way per endpoint: the scrapes that arrive while one is under way get its text instead
    of rendering their own (forty dashboards scraping 10,000 queues at once render once, not forty times)."""

    def __init__(self, server: "Server"):
        self.server = server
        self.under_way: dict[bool, asyncio.Task[bytes]] = {}  # per_object -> the rendering under way

    async def body(self, per_object: bool) -> bytes:
        rendering = self.under_way.get(per_object)
        if rendering is None:
            rendering = asyncio.ensure_future(render(self.server, per_object))
            self.under_way[per_object] = rendering
            rendering.add_done_callback(lambda _: self.under_way.pop(per_object))
        # A scrape that goes away (its client hung up) leaves the rendering to the others.
        return await asyncio.shield(rendering)


# --- the listener's routes -----------------------------------------------------------------------------------------
routes = web.RouteTableDef()
RENDERS = web.AppKey("renders", SharedRenders)
WRITE_PIECE = 64 * 1024  # bytes of a scrape's text written per turn of the event loop


async def _scrape(request: web.Request, per_object: bool) -> web.StreamResponse:
    """The scrape's text, written a piece per turn of the event loop: the scrapes sharing a rendering all wake in
    one turn, and handing the socket 13 MB for each of forty in that turn held the loop for a third of a second
    (a write returns at once while the socket takes the bytes, so it lets no other work run)."""
    body = memoryview(await request.app[RENDERS].body(per_object))
    response = web.StreamResponse(headers={"Content-Type": CONTENT_TYPE})
    response.content_length = len(body)
    try:
        await response.prepare(request)
        for start in range(0, len(body), WRITE_PIECE):
            await response.write(body[start:start + WRITE_PIECE])
            await asyncio.sleep(0)
        await response.write_eof()
    except ConnectionResetError:  # the scraper hung up (aiohttp's ClientConnectionResetError): nothing to tell it
        pass
    return response


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.StreamResponse:
    return await _scrape(request, per_object=False)


@routes.get("/metrics/per-object")
async def per_object_metrics(request: web.Request) -> web.StreamResponse:
    return await _scrape(request, per_object=True)


def make_prometheus_app(server: "Server") -> web.Application:
    app = web.Application()
    app[http.SERVER] = server
    app[RENDERS] = SharedRenders(server)
    app.add_routes(routes)
    return app
