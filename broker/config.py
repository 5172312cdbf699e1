"""Broker configuration: embedded defaults, an optional TOML file, then command-line overrides."""

from __future__ import annotations

import json
import os
import re
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

from broker.connection.login_throttle import MAX_DELAY as MAX_FAILED_LOGIN_DELAY
from broker.model.arguments.queue import LEADER_LOCATORS
from protocol.constants import DEFAULT_CHANNEL_MAX, DEFAULT_FRAME_MAX, DEFAULT_HEARTBEAT, FRAME_MIN_SIZE

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")  # plain lines, or one JSON object per line
MAX_MESSAGE_SIZE_LIMIT = 536870912  # RabbitMQ refuses a max_message_size above 512 MiB


class ConfigError(Exception):
    """A configuration value or file that cannot be used; the message says which and why."""


@dataclass
class Config:
    host: str = "127.0.0.1"
    port: int = 5672
    data_dir: str = "./data"
    # Worker processes behind the AMQP port, each leading a share of the vhosts ("auto": one per core), as
    # broker.workers runs them; 1 = one process, as ever
    workers: int = 1
    # With workers: every worker serves every vhost's clients, with a copy of its definitions, rather than hand
    # them to the worker that leads it (docs/workers.md#one-vhost-on-every-worker)
    spread_vhosts: bool = False
    log_level: str = "info"
    log_format: str = "text"  # one of LOG_FORMATS
    frame_max: int = DEFAULT_FRAME_MAX  # largest frame offered in connection.tune
    channel_max: int = DEFAULT_CHANNEL_MAX  # most channels per connection offered in connection.tune
    heartbeat: int = DEFAULT_HEARTBEAT  # heartbeat seconds offered in connection.tune (0 = off)
    default_consumer_prefetch: int = 0  # prefetch of consumers on channels that never sent basic.qos (0 = none)
    # ms a delivery may wait for its ack before its channel is closed (RabbitMQ's consumer_timeout; 0 = no limit)
    consumer_timeout: int = 1800000
    max_message_size: int = 134217728  # largest message body accepted, as RabbitMQ's max_message_size (128 MiB)
    default_user: str = "guest"  # created with default_pass and full rights on default_vhost at first start
    default_pass: str = "guest"
    default_vhost: str = "/"
    # Seconds before the second consecutive refused login from one address is answered; each further one waits
    # twice as long, up to 10 s; the first is answered at once, and 0 turns the slowdown off.
    failed_login_delay: float = 1.0
    cluster_name: str = "warren"  # reported in connection.start's server properties
    memory_high_watermark: float = 0.4  # share of the machine's memory above which publishers are blocked
    memory_limit: int = 0  # bytes of broker memory above which publishers are blocked; 0 = use the watermark
    # Ready messages a queue keeps in memory; those that arrive after them wait in page files until it shrinks
    queue_messages_in_memory: int = 10000
    management_host: str = "127.0.0.1"  # address of the management HTTP API
    management_port: int = 15672  # port of the management HTTP API (0 = no API), as RabbitMQ's plugin
    # ms between two samples of the message counters behind the management API's rates (RabbitMQ's
    # collect_statistics_interval)
    management_collect_statistics_interval: int = 5000
    management_tls: bool = False  # the management API speaks HTTPS with the [tls] certificate
    # Largest request body the management API reads, in bytes (RabbitMQ's management.http.max_body_size)
    management_max_body_size: int = 10_000_000
    # Open connections the management API keeps at most; one past it is closed at once, so that HTTP clients can
    # never take the file descriptors AMQP clients and the store need
    management_max_connections: int = 256
    # Host names (besides IP addresses, localhost and this machine's own names) that requests may name in their
    # Host header: the names the API is reached by through DNS; any other name is refused (DNS rebinding)
    management_hostnames: list[str] = field(default_factory=list)
    # [tls]: an amqps listener on tls_port, once a certificate and its key are given (as RabbitMQ's ssl_options)
    tls_port: int = 5671
    tls_certfile: str = ""  # the server's certificate chain (PEM)
    tls_keyfile: str = ""  # its private key (PEM)
    tls_cacertfile: str = ""  # CA certificates that client certificates are checked against (PEM)
    tls_verify: str = "verify_none"  # "verify_peer": ask clients for a certificate and check it
    tls_fail_if_no_peer_cert: bool = False  # with verify_peer: refuse clients that present no certificate
    prometheus_host: str = "127.0.0.1"  # address of the Prometheus metrics endpoint
    prometheus_port: int = 15692  # port of the Prometheus metrics endpoint (0 = none), as RabbitMQ's plugin
    prometheus_max_connections: int = 64  # open connections the metrics endpoint keeps at most (as management's)
    # Users who may log in only from this machine, as with RabbitMQ's loopback_users (guest by default).
    loopback_users: list[str] = field(default_factory=lambda: ["guest"])
    # A RabbitMQ definitions file (JSON) imported at every start, after recovery ("" = none), as RabbitMQ's
    # load_definitions.
    load_definitions: str = ""
    # [[vhosts]], [[users]], [[permissions]] and [[topic_permissions]] tables: definitions made at every start, after
    # load_definitions.
    vhosts: list[dict] = field(default_factory=list)
    users: list[dict] = field(default_factory=list)
    permissions: list[dict] = field(default_factory=list)
    topic_permissions: list[dict] = field(default_factory=list)
    # [[shovels]] tables: shovels defined at every start (RabbitMQ's static shovels), each a name, a vhost and the
    # keys of a dynamic shovel's definition
    shovels: list[dict] = field(default_factory=list)
    # [cluster]: this node is one of a replicated group coordinated through etcd (cluster/); no endpoints = one node
    cluster_etcd_endpoints: list[str] = field(default_factory=list)  # etcd client addresses, "host:port"
    cluster_node_id: str = ""  # this node's name in the cluster, unique and stable across restarts
    cluster_replication_port: int = 5680  # where followers stream the leader's writes (0 picks a free one)
    cluster_advertise_host: str = ""  # the address other nodes and forwarded clients reach this node at ("" = host)
    cluster_lease_ttl: float = 5.0  # seconds a node's etcd lease lives without a renewal: the failover time
    cluster_ack_timeout: float = 3.0  # seconds a follower may leave written frames unacknowledged before it is
    # dropped from the in-sync replicas
    cluster_min_insync: int = 2  # in-sync copies (the leader's included) a confirm waits for
    # A file holding the cluster's secret, the same on every node (as Erlang's cookie): it then crosses no network,
    # etcd's included ("": the secret etcd keeps, made by the first node)
    cluster_secret_file: str = ""
    # Every link between nodes over TLS (replication, forwarded clients and API requests), each node's [tls]
    # certificate checked by the other against [tls] cacertfile
    cluster_tls: bool = False
    # [federation]: ms between two checks that an exchange link's internal exchange is still there upstream (one
    # deleted there starts the link again), as RabbitMQ's internal_exchange_check_interval
    federation_internal_exchange_check_interval: int = 90000
    # [queues]: the worker that owns a new queue whose declare and policies name no leader locator, as RabbitMQ's
    # queue_leader_locator: "client-local" (the worker of its vhost) or "balanced" (the one with the fewest)
    queues_leader_locator: str = "client-local"
    # [mqtt]: the MQTT listener (docs/mqtt.md), RabbitMQ's plugin's settings
    mqtt_port: int = 1883  # 0 = no MQTT
    mqtt_tls_port: int = 0  # MQTT over TLS with the [tls] certificate (RabbitMQ's is 8883); 0 = none
    mqtt_web_port: int = 0  # MQTT over WebSockets on /ws (RabbitMQ's web_mqtt is 15675); 0 = none
    mqtt_vhost: str = "/"  # the vhost of clients whose user name names none ("vhost:user" names one)
    mqtt_exchange: str = "amq.topic"  # the topic exchange MQTT publishes go to and subscriptions bind to
    mqtt_prefetch: int = 10  # QoS 1 messages sent to a client and not yet acknowledged, at most
    # Clients that give no user name log in as default_user with default_pass; false: they are refused (RabbitMQ's
    # default is true, with guest, whom loopback_users keeps to this machine)
    mqtt_allow_anonymous: bool = False
    mqtt_default_user: str = "guest"
    mqtt_default_pass: str = "guest"
    mqtt_max_packet_size: int = 268_435_455  # largest packet accepted once logged in (before: 65,536 bytes)


# Which TOML section each key lives in. A key of a section in PREFIXED_SECTIONS is the Config field of the same name
# prefixed with the section's ([management] port = management_port).
SECTIONS = {
    "server": ("host", "port", "data_dir", "workers", "spread_vhosts", "log_level", "log_format", "cluster_name",
               "memory_high_watermark", "memory_limit", "queue_messages_in_memory", "load_definitions"),
    "management": ("host", "port", "tls", "collect_statistics_interval", "max_body_size", "max_connections",
                   "hostnames"),
    "prometheus": ("host", "port", "max_connections"),
    "cluster": ("etcd_endpoints", "node_id", "replication_port", "advertise_host", "lease_ttl", "ack_timeout",
                "min_insync", "secret_file", "tls"),
    "tls": ("port", "certfile", "keyfile", "cacertfile", "verify", "fail_if_no_peer_cert"),
    "federation": ("internal_exchange_check_interval",),
    "queues": ("leader_locator",),
    "mqtt": ("port", "tls_port", "web_port", "vhost", "exchange", "prefetch", "allow_anonymous", "default_user", "default_pass",
             "max_packet_size"),
    "amqp": ("frame_max", "channel_max", "heartbeat", "default_consumer_prefetch", "consumer_timeout",
             "max_message_size", "default_user", "default_pass", "default_vhost", "loopback_users",
             "failed_login_delay"),
}


# sections whose keys are prefixed with the section's name
PREFIXED_SECTIONS = ("management", "prometheus", "tls", "cluster", "federation", "queues", "mqtt")

# The keys of each [[table]] array, and whether each is required; each table is one item of RabbitMQ's
# definitions of that kind, so these are the keys a definitions file has too, but for WARREN_KEYS.
TABLE_ARRAYS = {
    "vhosts": {"name": True, "description": False, "tags": False, "worker": False},
    "users": {"name": True, "password": False, "password_hash": False, "hashing_algorithm": False, "tags": False},
    "permissions": {"user": True, "vhost": True, "configure": True, "write": True, "read": True},
    "topic_permissions": {"user": True, "vhost": True, "exchange": True, "write": True, "read": True},
    "shovels": {"name": True, "vhost": False},  # and the shovel's own keys, checked as an API's PUT checks them
}
OPEN_TABLES = ("shovels",)  # arrays whose tables hold keys beyond TABLE_ARRAYS' (checked where they are applied)
TABLE_KEY_TYPES = {"tags": (list, "a list of strings"), "worker": (int, "a worker number")}  # others: strings
WARREN_KEYS = {"vhosts": ("worker",)}  # keys of the tables that are not definitions: the worker a vhost is pinned to

# Config field type -> (Python type, how an error names it, the type of a list's items).
_EXPECTED_TYPES = {"int": (int, "an integer", None), "str": (str, "a string", None),
                   "float": ((int, float), "a number", None), "bool": (bool, "true or false", None),
                   "list[str]": (list, "a list of strings", str),
                   "list[dict]": (list, "a list of tables", dict)}


def load_config(path: str | Path | None = None, overrides: dict | None = None) -> Config:
    """Defaults, then the TOML file at path (if any), then overrides (e.g. from the command line). The file is
    checked whole, also where an override replaces a value: a bad file is refused before it bites a later start
    without that option."""
    from_file = _read_toml(Path(path)) if path is not None else {}
    _checked(from_file)
    config = _checked({**from_file, **{key: value for key, value in (overrides or {}).items() if value is not None}})
    _check_pins(config)  # (with the overrides: --workers may give the worker a pin names)
    if config.load_definitions:
        read_definitions(config.load_definitions)
    return config


def _checked(values: dict) -> Config:
    """The config of values over the defaults, each of the expected type and range (ConfigError naming the first
    that is not)."""
    types = {f.name: f.type for f in fields(Config)}
    if values.get("workers") == "auto":
        values = {**values, "workers": os.cpu_count() or 1}
    for key, value in values.items():
        kind, described, item_kind = _EXPECTED_TYPES[types[key]]
        if (not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool)
                or (item_kind is not None and not all(isinstance(item, item_kind) for item in value))):
            raise ConfigError(f"{key} must be {described}, got {value!r}")
    config = Config(**values)
    _validate(config)
    for array in TABLE_ARRAYS:
        for table in getattr(config, array):
            _validate_table(array, table)
    return config


def read_definitions(path: str) -> dict:
    """The definitions file named by load_definitions: a JSON object, or a ConfigError saying why not."""
    try:
        document = json.loads(Path(path).read_bytes())
    except OSError as error:
        raise ConfigError(f"cannot read load_definitions file {path}: {error.strerror}") from error
    except ValueError as error:
        raise ConfigError(f"load_definitions file {path} is not valid JSON: {error}") from error
    if not isinstance(document, dict):
        raise ConfigError(f"load_definitions file {path} must hold a JSON object, not {type(document).__name__}")
    return document


def _validate_table(array: str, table: dict) -> None:
    """One [[vhosts]], [[users]], [[permissions]], [[topic_permissions]] or [[shovels]] table: known keys of the
    right types, required ones present, and a password (or password hash) for a user."""
    keys = TABLE_ARRAYS[array]
    name = table.get("name", table.get("user"))
    where = f"[[{array}]] '{name}'" if isinstance(name, str) else f"[[{array}]]"
    for key, value in table.items():
        if key not in keys and array in OPEN_TABLES:
            continue
        if key not in keys:
            raise ConfigError(f"{where}: unknown key '{key}' (known: {', '.join(keys)})")
        kind, described = TABLE_KEY_TYPES.get(key, (str, "a string"))
        if (not isinstance(value, kind) or isinstance(value, bool)
                or (kind is list and not all(isinstance(item, str) for item in value))):
            raise ConfigError(f"{where}: {key} must be {described}, got {value!r}")
    missing = [key for key, required in keys.items() if required and key not in table]
    if missing:
        raise ConfigError(f"{where}: {', '.join(missing)} missing")
    if array == "users" and "password" not in table and "password_hash" not in table:
        raise ConfigError(f"{where}: needs a password or a password_hash")


def _read_toml(path: Path) -> dict:
    try:
        document = tomllib.loads(path.read_text())
    except OSError as error:
        raise ConfigError(f"cannot read config file {path}: {error.strerror}") from error
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"config file {path} is not valid TOML: {error}") from error
    values = {}
    for section, content in document.items():
        if section in TABLE_ARRAYS and isinstance(content, list):
            values[section] = content  # [[section]] tables, checked with the other values
            continue
        if section not in SECTIONS or not isinstance(content, dict):
            raise ConfigError(f"config file {path}: unknown section [{section}] (known: "
                              f"{', '.join(SECTIONS)}, and [[{']], [['.join(TABLE_ARRAYS)}]])")
        for key, value in content.items():
            if key not in SECTIONS[section]:
                raise ConfigError(f"config file {path}: unknown key '{key}' in [{section}] (known: "
                                  f"{', '.join(SECTIONS[section])})")
            values[f"{section}_{key}" if section in PREFIXED_SECTIONS else key] = value
    return values


# the listeners' ports (0 picks a free one)
PORTS = ("port", "management_port", "prometheus_port", "tls_port", "cluster_replication_port", "mqtt_port",
         "mqtt_tls_port", "mqtt_web_port")
TLS_VERIFY = ("verify_none", "verify_peer")  # RabbitMQ's ssl_options.verify values


def _validate_tls(config: Config) -> None:
    """The [tls] keys go together: a key with a certificate, a CA to check client certificates against."""
    if config.tls_verify not in TLS_VERIFY:
        raise ConfigError(f"tls verify must be one of {', '.join(TLS_VERIFY)}, got {config.tls_verify!r}")
    if bool(config.tls_certfile) != bool(config.tls_keyfile):
        raise ConfigError("tls certfile and keyfile go together: give both or neither")
    if config.tls_verify == "verify_peer" and not config.tls_cacertfile:
        raise ConfigError("tls verify = \"verify_peer\" needs a cacertfile to check client certificates against")
    if config.tls_fail_if_no_peer_cert and config.tls_verify != "verify_peer":
        raise ConfigError("tls fail_if_no_peer_cert needs verify = \"verify_peer\"")
    if (config.tls_verify == "verify_peer" or config.management_tls) and not config.tls_certfile:
        raise ConfigError("[tls] needs a certfile and a keyfile for " + (
            "management tls" if config.management_tls else "verify_peer"))


NODE_ID_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def _validate_cluster(config: Config) -> None:
    """[cluster] keys matter once etcd endpoints are given; then a node id is required."""
    if not config.cluster_etcd_endpoints:
        return
    for endpoint in config.cluster_etcd_endpoints:
        host, _, port = endpoint.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) <= 65535:
            raise ConfigError(f"cluster etcd_endpoints must be \"host:port\" addresses, got {endpoint!r}")
    node_id = config.cluster_node_id
    if not node_id or len(node_id) > 64 or not set(node_id) <= NODE_ID_CHARACTERS:
        raise ConfigError(f"cluster node_id must be 1 to 64 letters, digits, '-', '_' or '.', got {node_id!r}")
    if not config.port or not config.cluster_replication_port:
        raise ConfigError("a cluster node needs a fixed port and replication_port (0 would hide it from the others)")
    if not 1 <= config.cluster_lease_ttl <= 60:
        raise ConfigError(f"cluster lease_ttl must be between 1 and 60 seconds, got {config.cluster_lease_ttl}")
    if not 0.1 <= config.cluster_ack_timeout <= 60:
        raise ConfigError(f"cluster ack_timeout must be between 0.1 and 60 seconds, got {config.cluster_ack_timeout}")
    if not 1 <= config.cluster_min_insync <= 9:
        raise ConfigError(f"cluster min_insync must be between 1 and 9, got {config.cluster_min_insync}")
    if config.cluster_secret_file:
        read_secret(config.cluster_secret_file)
    if config.cluster_tls and not (config.tls_certfile and config.tls_cacertfile):
        raise ConfigError("[cluster] tls needs [tls] certfile, keyfile and cacertfile: this node's certificate, and the "
                          "CA that signed the other nodes'")
    if config.cluster_tls and config.management_port and not config.management_tls:
        raise ConfigError("[cluster] tls needs [management] tls: the API requests nodes forward to each other carry "
                          "their clients' credentials")
    if config.management_tls and not config.tls_cacertfile:  # a node asks the other nodes' management APIs
        raise ConfigError("[management] tls with [cluster] etcd_endpoints needs [tls] cacertfile: the CA that signed "
                          "the other nodes' certificates, which this node's API checks when it asks theirs")


MIN_SECRET_LENGTH = 16  # characters a cluster secret_file holds at least


def read_secret(path: str) -> str:
    """The cluster's secret a [cluster] secret_file holds (its text, without the whitespace around it); ConfigError
    naming the file when it cannot be read, others may read it, or it holds too short a secret."""
    try:
        mode = os.stat(path).st_mode
        secret = Path(path).read_text(encoding="utf-8").strip()
    except OSError as error:
        raise ConfigError(f"cannot read cluster secret_file {path}: {error.strerror}") from error
    except UnicodeDecodeError:
        raise ConfigError(f"cluster secret_file {path} is not UTF-8 text") from None
    if mode & 0o077:  # (as Erlang refuses a cookie file others may read)
        raise ConfigError(f"cluster secret_file {path} may be read by other users (mode {mode & 0o777:04o}): make it "
                          "its owner's alone (chmod 600)")
    if len(secret) < MIN_SECRET_LENGTH:
        raise ConfigError(f"cluster secret_file {path} holds {len(secret)} characters: a secret needs "
                          f"{MIN_SECRET_LENGTH} at least")
    return secret


MAX_BODY_SIZE_LIMIT = 536870912  # the largest management max_body_size accepted (512 MiB)
MAX_HTTP_CONNECTIONS = 100_000  # the most connections an HTTP listener may be allowed
HOSTNAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?")


def _validate_http(config: Config) -> None:
    """The management and Prometheus listeners' limits, and the host names the API answers to."""
    if not 1 <= config.management_max_body_size <= MAX_BODY_SIZE_LIMIT:
        raise ConfigError(f"management max_body_size must be between 1 and {MAX_BODY_SIZE_LIMIT} bytes, got "
                          f"{config.management_max_body_size}")
    for key in ("management_max_connections", "prometheus_max_connections"):
        if not 1 <= getattr(config, key) <= MAX_HTTP_CONNECTIONS:
            raise ConfigError(f"{key.replace('_', ' ', 1)} must be between 1 and {MAX_HTTP_CONNECTIONS}, got "
                              f"{getattr(config, key)}")
    for name in config.management_hostnames:
        if len(name) > 253 or not HOSTNAME.fullmatch(name):
            raise ConfigError(f"management hostnames must be DNS names (letters, digits, '-' and '.'), got {name!r}")


MAX_WORKERS = 256  # the most worker processes a node may run


def _validate_workers(config: Config) -> None:
    """The number of workers, and on a node of a cluster the replication ports of their groups."""
    if not 1 <= config.workers <= MAX_WORKERS:
        raise ConfigError(f"workers must be \"auto\" or between 1 and {MAX_WORKERS}, got {config.workers}")
    if config.spread_vhosts and config.cluster_etcd_endpoints:
        raise ConfigError("[server] spread_vhosts is for one node of workers: a cluster keeps each vhost in its "
                          "replication group")
    if not config.cluster_etcd_endpoints:
        return
    last = config.cluster_replication_port + config.workers - 1
    if config.cluster_replication_port and last > 65535:
        raise ConfigError(f"[cluster] replication_port {config.cluster_replication_port}: worker k's group uses "
                          f"replication_port + k, and {last} is past 65535")


def _check_pins(config: Config) -> None:
    """A vhost is pinned to a worker that exists."""
    for table in config.vhosts:
        if "worker" in table and not 0 <= table["worker"] < config.workers:
            raise ConfigError(f"[[vhosts]] '{table['name']}': worker {table['worker']} does not exist: workers are "
                              f"numbered from 0 to {config.workers - 1}")


def _validate(config: Config) -> None:
    _validate_workers(config)
    _validate_cluster(config)
    _validate_http(config)
    for key in PORTS:
        if not 0 <= getattr(config, key) <= 65535:
            raise ConfigError(f"{key} must be between 0 and 65535, got {getattr(config, key)}")
    _validate_tls(config)
    if not 10 <= config.management_collect_statistics_interval <= 3600000:
        raise ConfigError(f"collect_statistics_interval must be between 10 and 3600000 ms, got "
                          f"{config.management_collect_statistics_interval}")
    if config.log_level not in LOG_LEVELS:
        raise ConfigError(f"log_level must be one of {', '.join(LOG_LEVELS)}, got {config.log_level!r}")
    if config.queues_leader_locator not in LEADER_LOCATORS:
        raise ConfigError(f"[queues] leader_locator must be one of {', '.join(LEADER_LOCATORS)}, got "
                          f"{config.queues_leader_locator!r}")
    if config.log_format not in LOG_FORMATS:
        raise ConfigError(f"log_format must be one of {', '.join(LOG_FORMATS)}, got {config.log_format!r}")
    if config.frame_max < FRAME_MIN_SIZE:
        raise ConfigError(f"frame_max must be at least {FRAME_MIN_SIZE}, got {config.frame_max}")
    if not 1 <= config.channel_max <= 65535:
        raise ConfigError(f"channel_max must be between 1 and 65535, got {config.channel_max}")
    if not 0 <= config.heartbeat <= 65535:
        raise ConfigError(f"heartbeat must be between 0 and 65535, got {config.heartbeat}")
    if not 0 < config.memory_high_watermark <= 1:
        raise ConfigError(f"memory_high_watermark must be above 0 and at most 1, got {config.memory_high_watermark}")
    if config.memory_limit < 0:
        raise ConfigError(f"memory_limit must not be negative, got {config.memory_limit}")
    if config.queue_messages_in_memory < 1:
        raise ConfigError(f"queue_messages_in_memory must be at least 1, got {config.queue_messages_in_memory}")
    if not 100 <= config.federation_internal_exchange_check_interval <= 86400000:
        raise ConfigError(f"federation internal_exchange_check_interval must be between 100 and 86400000 ms, got "
                          f"{config.federation_internal_exchange_check_interval}")
    if not 1 <= config.max_message_size <= MAX_MESSAGE_SIZE_LIMIT:
        raise ConfigError(f"max_message_size must be between 1 and {MAX_MESSAGE_SIZE_LIMIT}, got "
                          f"{config.max_message_size}")
    if not 0 <= config.failed_login_delay <= MAX_FAILED_LOGIN_DELAY:
        raise ConfigError(f"failed_login_delay must be between 0 and {MAX_FAILED_LOGIN_DELAY:g}, got "
                          f"{config.failed_login_delay}")
    if config.consumer_timeout < 0:
        raise ConfigError(f"consumer_timeout must be 0 (no limit) or more milliseconds, got {config.consumer_timeout}")
    if config.mqtt_tls_port and not config.tls_certfile:
        raise ConfigError("[mqtt] tls_port needs [tls] certfile and keyfile: the certificate MQTT over TLS presents")
    if not 1 <= config.mqtt_prefetch <= 65535:
        raise ConfigError(f"[mqtt] prefetch must be between 1 and 65535, got {config.mqtt_prefetch}")
    if not 65_536 <= config.mqtt_max_packet_size <= 268_435_455:
        raise ConfigError(f"[mqtt] max_packet_size must be between 65536 and 268435455, got "
                          f"{config.mqtt_max_packet_size}")
    if not 0 <= config.default_consumer_prefetch <= 65535:
        raise ConfigError(f"default_consumer_prefetch must be between 0 and 65535, got "
                          f"{config.default_consumer_prefetch}")
