"""The TCP server: accepts connections, owns the node (vhosts, users), holds the resource alarms, shuts down cleanly."""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import os
import signal
import socket
import ssl
import time
from importlib import metadata
from pathlib import Path
from typing import Callable, Protocol

from broker import collector
from broker.config import TABLE_ARRAYS, WARREN_KEYS, Config, ConfigError, read_definitions
from broker.connection.alarms.disk import DiskAlarm
from broker.connection.alarms.memory import MemoryAlarm, memory_limit, release_freed_memory
from broker.connection.connection import HANDSHAKE_TIMEOUT, Connection
from broker.connection.greeting import platform_name
from broker.connection.login_throttle import LoginThrottle
from broker.connection.mqtt.connection import MqttConnection
from broker.connection.mqtt.expiry import SessionExpiry
from broker.connection.mqtt.wills import Wills
from broker.connection.tls import TlsError, server_context
from broker.model.definitions import DefinitionsError, import_definitions
from broker.model.durability import UnownedQueue, held_vhosts, restore
from broker.model.features.paging import Paging
from broker.model.node import Node
from broker.model.queue import Queue
from broker.model.transactions import restore_shares
from broker.federation.component import Federation
from broker.federation.link import LinkSettings
from broker.shovel.component import Shovels, static_shovel
from broker.session.limits import ChannelLimits
from storage.format import UnsupportedFormat
from storage.pages import PageStore
from storage.recovery import Recovered
from storage.segments import fsync_directories, make_directories
from storage.standby import Standby
from storage.store import DataDirLocked, MessageStore

log = logging.getLogger(__name__)

SHUTDOWN_GRACE = 3.0  # seconds clients get to answer connection.close before their sockets are closed
# Resource alarms in priority order, each with its connection.blocked reason (RabbitMQ's texts).
ALARM_REASONS = {"memory": "low on memory", "disk": "low on disk"}
WRITE_PROBE = ".write-probe"  # created and removed at start to prove the data dir writable


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT: the daemon's cue to shut down cleanly."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


class StartupError(Exception):
    """The broker cannot start; the message tells the operator why (shown without a traceback)."""


def version() -> str:
    """The installed package's version ("0.0.0" when run from a tree that is not installed)."""
    try:
        return metadata.version("warren")
    except metadata.PackageNotFoundError:
        return "0.0.0"


def reason_of(error: OSError) -> str:
    """An OSError's reason alone ("Address already in use"), without the text asyncio wraps around it."""
    if isinstance(error, socket.gaierror) or not error.errno or error.errno < 0:
        return error.strerror or str(error)
    return os.strerror(error.errno)


def data_dir_error(data_dir: Path, error: OSError) -> StartupError:
    """An OSError met in the data dir, naming it (and the file inside it, if that is where it happened)."""
    inside = error.filename is not None and Path(error.filename) != data_dir
    where = f" ({error.filename})" if inside else ""
    return StartupError(f"cannot use data dir {data_dir}: {reason_of(error)}{where}")


def prepare_data_dir(data_dir: Path) -> None:
    """Create the data dir (and its parents) if missing, and prove that it is a writable directory."""
    probe = data_dir / WRITE_PROBE
    try:
        if data_dir.exists() and not data_dir.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
        made: set[Path] = set()  # directories whose entries changed: each made directory's parent
        make_directories(data_dir, made)
        fsync_directories(made)  # a power cut cannot take the new data dir, or a parent made for it, away
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
        probe.unlink(missing_ok=True)  # another broker starting on this dir may have removed it
    except OSError as error:
        raise StartupError(f"cannot use data dir {data_dir}: {reason_of(error)}") from error


class WorkerRole(Protocol):
    """What a server that is one of several worker processes learns from the others at start (broker.workers)."""

    keeps_node_definitions: bool  # the node-wide definitions are this worker's own (the others copy them)
    led: set[str]  # the vhosts it leads (known once boot_definitions has run)

    def serves(self, vhost: str) -> bool:
        """Whether the vhost's clients are this worker's (its group holds the vhost)."""
        ...

    async def boot_definitions(self, document: dict, found: list[str], node: Node) -> dict:
        """The boot definitions this worker applies, given the configured ones, the vhosts whose contents its store
        held (broker.model.durability.held_vhosts) and the node after bootstrap."""
        ...


class Leadership(Protocol):
    """Where a vhost is led, as an operator may choose it (broker.management.views.leadership): by the broker that
    leads the vhost's replication group, one worker's (cluster.worker), in a cluster or on one node of workers."""

    being_drained: bool  # this node is in maintenance (``warrenctl drain``)

    async def state(self, vhost: str) -> dict:
        """{"group": its replication group, "node": the node that leads it, "pinned": the node an operator asked
        for, or None}."""
        ...

    async def pin(self, vhost: str, node: str | None) -> None:
        """Have ``node`` lead the vhost's group from now on (None: whichever node the election gives); ValueError
        naming why it cannot, RuntimeError while it cannot be done now (etcd cannot be reached)."""
        ...

    def check_move(self, vhost: str, group: int) -> None:
        """ValueError naming why the vhost's data cannot move to another group (then moved by the supervisor, on a
        node of workers outside a cluster: broker.workers.moving)."""
        ...

    def check_queue_move(self, vhost: str, queue: Queue, group: int) -> None:
        """ValueError naming why a queue of the vhost cannot move to another worker's group (then moved by the
        supervisor, on a node of workers outside a cluster: broker.workers.moving)."""
        ...


class Server:
    def __init__(self, config: Config, role: WorkerRole | None = None, accepting: bool = True):
        self.config = config
        self.role = role  # this server's part among several worker processes; None: it is the only one
        # whether it accepts clients itself; a worker serves only those its node's front doors hand to it
        # (broker.connection.front_door)
        self.accepting = accepting
        self.leadership: Leadership | None = None  # with several workers, or on a cluster's leader
        self.standby: Standby | None = None  # a promoted follower's hot standby of the data dir (cluster.node)
        # consecutive refused AMQP logins per address, answered more and more slowly (in a worker of several, the
        # supervisor keeps the count: broker.workers.logins)
        self.failed_logins = LoginThrottle()
        self.data_dir = Path(config.data_dir).absolute()
        # raised while the store's durable writes fail, until they work again with room to spare
        self.disk_alarm = DiskAlarm(self.data_dir, self._disk_alarm_changed)
        self.store = MessageStore(self.data_dir, on_health=self.disk_alarm.store_health_changed)
        # where deep queues set their ready messages aside (emptied at every start)
        self.paging = Paging(PageStore(self.data_dir / "pages"), config.queue_messages_in_memory)
        self.node = Node(self.store, self.paging)  # vhosts, users and permissions
        if role is not None:
            self.node.serves = role.serves
        self.shovels = Shovels(self.node, config.cluster_name, self._loopback)  # run while this server serves
        self.federation = Federation(self.node, LinkSettings(  # its links too
            config.cluster_name, self._loopback, config.federation_internal_exchange_check_interval / 1000))
        self.connections: set[Connection | MqttConnection] = set()  # every client's, whatever its protocol
        # the MQTT connection of each (vhost, client id): a second one with the same takes over
        self.mqtt_clients: dict[tuple[str, str], MqttConnection] = {}
        # keys the token that marks an MQTT client's own publishes for its no_local subscriptions: the same for every
        # connection of a client id while this process runs (its sessions are served here), guessed by none
        self.mqtt_token_key = os.urandom(32)
        self.mqtt_wills = Wills(self.node, config.mqtt_exchange)  # the wills MQTT 5.0 holds back for a while
        self.mqtt_sessions = SessionExpiry(self.node)  # MQTT sessions that outlive their connection for a while
        self.version = version()
        self.platform = platform_name()
        self.listener: asyncio.base_events.Server | None = None
        self.tls_listener: asyncio.base_events.Server | None = None  # amqps, when [tls] names a certificate
        self.tls_context: ssl.SSLContext | None = None  # the amqps listener's (the management API's too, if asked)
        self.mqtt_listener: asyncio.base_events.Server | None = None  # [mqtt] port's
        self.mqtt_tls_listener: asyncio.base_events.Server | None = None  # [mqtt] tls_port's
        limit = memory_limit(config.memory_high_watermark, config.memory_limit)
        self.memory_alarm = MemoryAlarm(limit, self._memory_alarm_changed)  # blocks publishers above the limit
        self.alarms: set[str] = set()  # resources whose alarm is on (keys of ALARM_REASONS)
        # What every channel works within (its alarm says why publishers are blocked), handed to them by connections
        self.channel_limits = ChannelLimits(self.node, config.max_message_size, config.default_consumer_prefetch,
                                            config.consumer_timeout, limit)
        self.started_at = time.time()  # wall-clock seconds the broker was made
        self.recovery_report: dict = {}  # what the store recovered at start (storage.recovery's report)
        self.recovery_seconds = 0.0  # from reading the store to every queue rebuilt, at start
        self.serving = False  # from the end of start() until stop() begins: the management API answers 503 outside

    # --- resource alarms ------------------------------------------------------------------------------------
    def _set_alarm(self, resource: str, active: bool) -> None:
        """Turn one resource's alarm on or off; publishers are unblocked once no alarm is left."""
        if active:
            self.alarms.add(resource)
        else:
            self.alarms.discard(resource)
        alarm = next((reason for name, reason in ALARM_REASONS.items() if name in self.alarms), None)
        self.channel_limits.alarm = alarm
        if alarm is None:
            for connection in list(self.connections):
                connection.unblock()

    def _memory_alarm_changed(self, active: bool) -> None:
        if active:
            log.warning("memory alarm: resident memory above %d bytes; publishing connections are blocked",
                        self.memory_alarm.limit)
        else:
            log.warning("memory alarm cleared")
        self._set_alarm("memory", active)

    def _disk_alarm_changed(self, active: bool) -> None:
        if active:
            log.critical("disk alarm: durable writes to %s are failing; persistent messages are refused and "
                         "publishing connections are blocked", self.data_dir)
        else:
            log.warning("disk alarm cleared: durable writes to %s work again", self.data_dir)
        self._set_alarm("disk", active)

    # --- start and stop -------------------------------------------------------------------------------------
    async def take_ports(self) -> None:
        """Load the TLS certificate and take the AMQP ports, so that a bad certificate or a port in use is reported
        before the data dir is touched."""
        config = self.config
        if config.tls_certfile:
            try:
                self.tls_context = server_context(config)
            except TlsError as error:
                raise StartupError(str(error)) from error
        self.listener = await self._listen(config.port)
        if self.tls_context is not None:
            self.tls_listener = await self._listen(config.tls_port, self.tls_context)
        if config.mqtt_port:
            self.mqtt_listener = await self._listen(config.mqtt_port, None, lambda: MqttConnection(self))
        if config.mqtt_tls_port:
            self.mqtt_tls_listener = await self._listen(config.mqtt_tls_port, self.tls_context,
                                                        lambda: MqttConnection(self))

    async def start(self) -> None:
        """Take the ports if take_ports() has not, recover durable state, then serve."""
        if self.listener is None and self.accepting:
            await self.take_ports()
        await self._recover()
        release_freed_memory()
        self.memory_alarm.start()
        for listener, what in ((self.mqtt_listener, " (MQTT)"), (self.mqtt_tls_listener, " (MQTT over TLS)"),
                               (self.tls_listener, " (AMQP over TLS)"), (self.listener, "")):
            if listener is not None:
                await listener.start_serving()
                host, port = listener.sockets[0].getsockname()[:2]
                log.info("Warren %s listening on %s:%d%s", self.version, host, port, what)
        self.serving = True
        self.shovels.start()
        self.federation.start()

    def listeners(self) -> list[asyncio.base_events.Server]:
        return [listener for listener in (self.listener, self.tls_listener, self.mqtt_listener, self.mqtt_tls_listener)
                if listener is not None]

    async def _listen(self, port: int, tls: ssl.SSLContext | None = None,
                      protocol: Callable[[], asyncio.Protocol] | None = None) -> asyncio.base_events.Server:
        host = self.config.host
        try:
            return await asyncio.get_running_loop().create_server(
                protocol or (lambda: Connection(self)), host, port, reuse_address=True, backlog=1024,
                start_serving=False,
                ssl=tls, ssl_handshake_timeout=HANDSHAKE_TIMEOUT if tls is not None else None)
        except OSError as error:
            raise StartupError(f"cannot listen on {host}:{port}: {reason_of(error)}") from error

    async def _recover(self) -> None:
        """Read the store back on a thread of its own, so that the loop goes on meanwhile (a cluster leader keeps its
        lease alive and its followers hear from it however long the store's records take to read), then rebuild
        the model on the loop (queues arm their timers there)."""
        # Recovery makes millions of long-lived objects at once: collecting meanwhile only walks them again and
        # again, and once frozen they stay out of later full collections (broker.collector).
        gc.disable()
        started = time.perf_counter()
        try:
            recovered = await asyncio.get_running_loop().run_in_executor(None, self._recover_store)
            self.recovery_report = recovered.report
            self.paging.store.start()
            self.node.restore_definitions(recovered.vhosts, recovered.users, recovered.permissions,
                                          recovered.topic_permissions)
            found = held_vhosts(recovered)
            boot_definitions = self._boot_definitions()
            if self.role is None or self.role.keeps_node_definitions:  # the other workers copy the first one's users
                self._bootstrap(defines_users=bool(boot_definitions.get("users")))
            if self.role is not None:
                boot_definitions = await self.role.boot_definitions(boot_definitions, found, self.node)
            try:
                restore(self.node, recovered, self.role.led if self.role is not None else None)
            except UnownedQueue as refusal:
                raise StartupError(str(refusal)) from refusal
            restore_shares(self.node, recovered)  # (of transactions across processes a stop interrupted)
            self.mqtt_sessions.restore(recovered.mqtt_sessions)
            self.mqtt_wills.restore(recovered.mqtt_wills)
            self.store.streams.remove_orphans()  # what deleted streams left behind
            self._import_boot_definitions(boot_definitions)
            self.recovery_seconds = time.perf_counter() - started
        except OSError as error:
            raise data_dir_error(self.data_dir, error) from error
        finally:
            collector.freeze()
            gc.enable()

    def _recover_store(self) -> Recovered:
        prepare_data_dir(self.data_dir)
        try:
            return self.store.recover(self.standby)  # takes the data dir's lock first
        except OSError as error:
            raise data_dir_error(self.data_dir, error) from error
        except (DataDirLocked, UnsupportedFormat) as refusal:  # their text is meant for the operator as it is
            raise StartupError(str(refusal)) from refusal

    def _boot_definitions(self) -> dict:
        """What every start applies once recovery is done: the load_definitions file's definitions, then the
        config's [[vhosts]], [[users]], [[permissions]], [[topic_permissions]] and [[shovels]] (so that these
        win)."""
        path = self.config.load_definitions
        try:
            document = read_definitions(path) if path else {}
        except ConfigError as error:
            raise StartupError(str(error)) from error
        for section in TABLE_ARRAYS:
            kept_out = WARREN_KEYS.get(section, ())
            tables = [{key: value for key, value in table.items() if key not in kept_out}
                      for table in getattr(self.config, section)]
            if section == "shovels":  # (a shovel is a runtime parameter, as an export holds it)
                section, tables = "parameters", [static_shovel(table) for table in tables]
            existing = document.get(section, [])
            if tables and isinstance(existing, list):  # a file's non-list is reported by the import
                document[section] = existing + tables
        return document

    def _bootstrap(self, defines_users: bool) -> None:
        """On a node's first start, the default vhost and user (RabbitMQ's default_vhost/default_user); boot
        definitions that define users replace the default user, as in RabbitMQ."""
        if not defines_users:
            self.node.bootstrap(self.config.default_vhost, self.config.default_user, self.config.default_pass)
        elif not self.node.vhosts and not self.node.users:
            self.node.add_vhost(self.config.default_vhost, "Default virtual host")

    def _import_boot_definitions(self, document: dict) -> None:
        if not document:
            return
        copied = self.role is not None and not self.role.keeps_node_definitions
        sources = ["worker 0's users, vhosts and permissions"] if copied else []
        sources += [f"load_definitions file {self.config.load_definitions}"] if self.config.load_definitions else []
        sources += [f"[[{section}]]" for section in TABLE_ARRAYS if getattr(self.config, section)]
        try:
            import_definitions(self.node, document)
        except DefinitionsError as error:
            reason = " ".join(str(error).split())  # one line (some of RabbitMQ's policy texts span several)
            raise StartupError(f"cannot apply the definitions of {' and '.join(sources)}: {reason}") from error
        log.info("applied the definitions of %s", " and ".join(sources))

    def _loopback(self) -> tuple[str, int]:
        """Where this node's AMQP port is reached from here (a shovel's URI without a host)."""
        host = self.config.host
        if host in ("", "0.0.0.0", "::"):
            host = "::1" if host == "::" else "127.0.0.1"
        return host, self.port

    @property
    def port(self) -> int:
        return self.listener.sockets[0].getsockname()[1] if self.listener is not None else self.config.port

    @property
    def tls_port(self) -> int | None:
        if self.tls_listener is not None:
            return self.tls_listener.sockets[0].getsockname()[1]
        return self.config.tls_port if self.config.tls_certfile else None  # (a worker's: its node's front doors')

    async def stop(self, grace: float = SHUTDOWN_GRACE) -> None:
        """Stop accepting, send every client connection.close 320 CONNECTION_FORCED, wait at most ``grace`` seconds
        for them to go (a cluster leader that lost its lease gives none)."""
        served, self.serving = self.serving, False
        self.shovels.stop()
        self.federation.stop()
        self.mqtt_wills.stop()
        self.mqtt_sessions.stop()
        for listener in self.listeners():
            listener.close()
        connections = list(self.connections)
        for connection in connections:
            connection.close_for_shutdown()
        deadline = asyncio.get_running_loop().time() + grace
        while self.connections and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        for connection in list(self.connections):
            connection._terminate()
        for listener in self.listeners():
            await listener.wait_closed()
        self.memory_alarm.stop()
        self.disk_alarm.stop()
        self.node.record_ends()  # (in the store's last batch)
        if self.store.begin_close():  # the writer's last fsync may hang on a failing disk: waited for off the loop
            await asyncio.get_running_loop().run_in_executor(None, self.store.finish_close)
        self.paging.store.close()
        if served:  # (a start that failed says why, not this)
            log.info("Warren stopped")
