"""What the broker says first in every handshake, connection.start and connection.tune: the same from a worker that
runs the handshake itself and from a front door that answers for the worker it routes the client to
(broker.connection.front_door), so that the client cannot tell them apart."""

from __future__ import annotations

import platform

from pamqp import commands as spec

from broker.config import Config
from protocol.constants import SERVER_CAPABILITIES


def platform_name() -> str:
    return f"Python {platform.python_version()}"


def start(config: Config, version: str, platform: str) -> spec.Connection.Start:
    properties = {
        "product": "Warren",
        "version": version,
        "platform": platform,
        "copyright": "Warren contributors",
        "information": "An AMQP 0-9-1 broker; licensed under the Apache License 2.0",
        "capabilities": dict(SERVER_CAPABILITIES),
        "cluster_name": config.cluster_name,
    }
    return spec.Connection.Start(version_major=0, version_minor=9, server_properties=properties,
                                 mechanisms="PLAIN AMQPLAIN", locales="en_US")


def tune(config: Config) -> spec.Connection.Tune:
    return spec.Connection.Tune(channel_max=config.channel_max, frame_max=config.frame_max, heartbeat=config.heartbeat)
