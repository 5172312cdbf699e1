"""The shovels of a broker: the runtime parameters of component "shovel", each run while this process serves its
vhost (one process of a node of workers, the leader of the vhost's group in a cluster: so one instance runs in the
whole cluster, and moves with the vhost's leadership)."""

from __future__ import annotations

import logging

from broker.model.node import Node
from broker.shovel.definition import checked
from broker.shovel.running import RunningShovel

log = logging.getLogger(__name__)

COMPONENT = "shovel"


class Shovels:
    """The shovel component (broker.model.interfaces.ParameterComponent) and the shovels it runs."""

    def __init__(self, node: Node, cluster_name: str) -> None:
        self.node = node
        self.cluster_name = cluster_name
        self.running: dict[tuple[str, str], RunningShovel] = {}  # (vhost, name) -> the shovel at work
        self.started = False  # start() has run: changes start shovels at once (before, start() does)
        node.parameter_components[COMPONENT] = self

    # --- broker.model.interfaces.ParameterComponent ---------------------------------------------------------
    def check(self, vhost: str, name: str, value: object) -> None:
        checked(vhost, name, value)

    def changed(self, vhost: str, name: str, value: object) -> None:
        self._stop_one(vhost, name)
        if value is not None and self.started and self.node.serves(vhost):
            self._start_one(vhost, name, value)

    # --- the broker's start and stop --------------------------------------------------------------------------
    def start(self) -> None:
        """Run the shovels of the vhosts this process serves (once it serves)."""
        self.started = True
        for vhost in self.node.vhosts.values():
            if self.node.serves(vhost.name):
                for (component, name), value in vhost.parameters.items():
                    if component == COMPONENT:
                        self._start_one(vhost.name, name, value)

    def stop(self) -> None:
        self.started = False
        for vhost, name in list(self.running):
            self._stop_one(vhost, name)

    # --- what the API asks ------------------------------------------------------------------------------------
    def status(self, vhost: str | None = None) -> list[dict]:
        """The shovels' entries in GET /api/shovels (of one vhost, or all), by vhost then name (the API adds the
        node's name)."""
        return [shovel.status() for key, shovel in sorted(self.running.items())
                if vhost is None or key[0] == vhost]

    def restart(self, vhost: str, name: str) -> bool:
        """Start a shovel again (a terminated one at once); False if none runs here by that name."""
        if (vhost, name) not in self.running:
            return False
        value = self.node.vhost(vhost).parameters[(COMPONENT, name)]
        self._stop_one(vhost, name)
        self._start_one(vhost, name, value)
        return True

    def _start_one(self, vhost: str, name: str, value: object) -> None:
        try:
            shovel = checked(vhost, name, value)
        except ValueError as error:  # (stored by an earlier version that checked less)
            log.error("shovel %r in vhost %r cannot run: %s", name, vhost, error)
            return
        self.running[(vhost, name)] = RunningShovel(shovel, self.cluster_name, self._done)

    def _stop_one(self, vhost: str, name: str) -> None:
        running = self.running.pop((vhost, name), None)
        if running is not None:
            running.stop()

    def _done(self, shovel) -> None:
        """A shovel moved all it was to (src-delete-after): its parameter goes, as RabbitMQ's does."""
        self.running.pop((shovel.vhost, shovel.name), None)
        if shovel.vhost in self.node.vhosts and (COMPONENT, shovel.name) in self.node.vhosts[shovel.vhost].parameters:
            self.node.clear_parameter(shovel.vhost, COMPONENT, shovel.name)
