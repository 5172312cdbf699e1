"""Daemon entry point: `warren-server` / `python -m broker`."""

from __future__ import annotations

import argparse
import logging
import os
import resource
import sys
from pathlib import Path
from typing import NamedTuple

import uvloop

from broker import compiled, interpreter, logs
from broker.config import LOG_FORMATS, LOG_LEVELS, ConfigError, load_config
from broker.connection.mqtt.connection import MqttConnection
from broker.connection.server import Server, StartupError, stop_on_signals, version
from broker.management.server import take_management, take_prometheus, take_web_mqtt
from broker.workers.placement import Placement, PlacementError

log = logging.getLogger("broker")


def workers_argument(text: str) -> int | str:
    """--workers: a number, or "auto" (the config's check says what a bad number is)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or auto, got {text!r}") from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="warren-server", description="Warren, an AMQP 0-9-1 message broker")
    parser.add_argument("--config", help="TOML config file (see docker/warren.toml)")
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="AMQP port (default 5672; 0 picks a free one)")
    parser.add_argument("--workers", type=workers_argument,
                        help="worker processes, each leading a share of the vhosts (default 1; auto = one per core)")
    parser.add_argument("--data-dir", dest="data_dir", help="directory for durable state (default ./data)")
    parser.add_argument("--log-level", dest="log_level", choices=LOG_LEVELS, help="default info")
    parser.add_argument("--log-format", dest="log_format", choices=LOG_FORMATS,
                        help="text lines (default) or one JSON object per line")
    parser.add_argument("--management-host", dest="management_host",
                        help="address of the management HTTP API (default 127.0.0.1, whatever --host is)")
    parser.add_argument("--management-port", dest="management_port", type=int,
                        help="management HTTP API port (default 15672; 0 = no API)")
    parser.add_argument("--tls-port", dest="tls_port", type=int,
                        help="amqps port, used once [tls] names a certificate (default 5671; 0 picks a free one)")
    parser.add_argument("--prometheus-host", dest="prometheus_host",
                        help="address of the Prometheus metrics endpoint (default 127.0.0.1, whatever --host is)")
    parser.add_argument("--prometheus-port", dest="prometheus_port", type=int,
                        help="Prometheus metrics port (default 15692; 0 = no metrics endpoint)")
    parser.add_argument("--mqtt-port", dest="mqtt_port", type=int, help="MQTT port (default 1883; 0 = no MQTT)")
    parser.add_argument("--version", action="version", version=f"warren-server {version()}")
    return parser.parse_args(argv)


# Settings that may come from the environment (above the config file, below the command line), so that a password
# need not appear in a config file or on a command line (the Docker image's WARREN_DEFAULT_USER/PASS).
ENVIRONMENT = {"default_user": "WARREN_DEFAULT_USER", "default_pass": "WARREN_DEFAULT_PASS"}


def config_overrides(args: argparse.Namespace, environ: dict[str, str]) -> dict:
    """Values that override the config file: non-empty environment variables, then command-line options (each
    named as the setting it overrides)."""
    overrides = {key: environ.get(variable) or None for key, variable in ENVIRONMENT.items()}
    overrides.update({key: value for key, value in vars(args).items() if key != "config"})
    return overrides


async def serve(config, files: OpenFiles) -> None:
    interpreter.tune()  # (the supervisor's too: its API decodes and merges its workers' listings)
    if config.workers > 1 or config.cluster_etcd_endpoints:
        # Worker processes behind one AMQP port: several ([server] workers), or a cluster node's, one or more, each
        # leading or following a replication group of its own (cluster.worker)
        from broker.workers.supervisor import supervise  # one process never loads the supervisor

        await supervise(config, started=lambda: say_open_files_limit(config, files))
        return
    try:  # a data dir that several workers used keeps vhosts in stores one process would not read
        Placement.load(Path(config.data_dir), workers=1)
    except PlacementError as error:
        raise StartupError(str(error)) from error
    except OSError:
        pass  # the server's own check of the data dir says what is wrong with it
    server = Server(config)
    await server.take_ports()  # every port, the HTTP ones too, before the data dir is touched
    management = await take_management(server) if config.management_port else None
    prometheus = await take_prometheus(server) if config.prometheus_port else None
    web_mqtt = await take_web_mqtt(config, lambda: MqttConnection(server)) if config.mqtt_web_port else None
    listeners = [listener for listener in (management, prometheus, web_mqtt) if listener is not None]
    await server.start()
    say_open_files_limit(config, files)
    for listener in listeners:
        await listener.serve()
    stop = stop_on_signals()
    await stop.wait()
    log.info("shutting down")
    for listener in listeners:
        await listener.stop()
    await server.stop()


class OpenFiles(NamedTuple):
    """What became of the open-files limit at start: logged once the data dir is in use (a start refused before
    that prints its reason alone)."""

    was: int  # the soft limit the process started with
    now: int  # the soft limit it has
    problem: str | None  # why it could not be raised, if it could not


def raise_open_files_limit() -> OpenFiles:
    """Raise the soft limit on open files to the hard one: the default 1,024 is soon spent by AMQP clients, the
    store's files and HTTP clients together."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return OpenFiles(soft, soft, None)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as error:
        return OpenFiles(soft, soft, f"cannot raise it to {hard}: {error}")
    return OpenFiles(soft, hard, None)


def say_open_files_limit(config, files: OpenFiles) -> None:
    """One line on the open-files limit; a warning when the HTTP listeners may hold more than half of those files,
    which would leave AMQP clients and the store short."""
    if files.problem:
        log.warning("open files limit stays %d: %s", files.now, files.problem)
    else:
        log.info("open files limit: %d%s", files.now, f" (raised from {files.was})" if files.now != files.was else "")
    http = config.management_max_connections * bool(config.management_port) + (
        config.prometheus_max_connections * bool(config.prometheus_port))
    if http > files.now // 2:
        log.warning("the management and Prometheus listeners may hold %d connections, more than half of the %d "
                    "open files this process may have: lower their max_connections", http, files.now)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if refused := compiled.refusal():
        print(f"warren-server: {refused}", file=sys.stderr)
        return 2
    try:
        config = load_config(args.config, config_overrides(args, os.environ))
    except ConfigError as error:
        print(f"warren-server: {error}", file=sys.stderr)
        return 2
    logs.configure(config.log_level, config.log_format)
    if pure := compiled.missing():
        log.warning("%d of the %d modules on the path of every message run as pure Python, which costs more CPU per "
                    "message (make, or a wheel built where a C compiler is, compiles them): %s", len(pure),
                    len(compiled.built_sources()), ", ".join(pure))
    files = raise_open_files_limit()
    try:
        uvloop.run(serve(config, files))
    except StartupError as error:
        print(f"warren-server: {error}", file=sys.stderr)
        return 1
    # Everything is flushed and closed: skip freeing millions of queued messages one by one on the way out.
    logging.shutdown()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
