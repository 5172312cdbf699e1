"""The shovels of a broker: the runtime parameters of component "shovel", each run while this process serves its
vhost (one process of a node of workers, the leader of the vhost's group in a cluster: so one instance runs in the
whole cluster, and moves with the vhost's leadership)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Coroutine

from broker.model.node import Node
from broker.links.validation import DefinitionError
from broker.shovel.definition import Shovel, checked
from broker.shovel.running import RunningShovel, status_entry

log = logging.getLogger(__name__)

COMPONENT = "shovel"


class Shovels:
    """The shovel component (broker.model.interfaces.ParameterComponent) and the shovels it runs."""

    def __init__(self, node: Node, cluster_name: str, local: Callable[[], tuple[str, int]]) -> None:
        self.node = node
        self.local = local  # this node's AMQP host and port, for URIs without a host
        self.cluster_name = cluster_name
        self.running: dict[tuple[str, str], RunningShovel] = {}  # (vhost, name) -> the shovel at work
        # (vhost, name) -> the status of a stored definition that does not pass the checks (an earlier version's)
        self.unusable: dict[tuple[str, str], dict] = {}
        self.started = False  # start() has run: changes start shovels at once (before, start() does)
        self.cleaning: set[asyncio.Task] = set()  # deleted shovels' exchange queues being deleted at their source
        node.parameter_components[COMPONENT] = self

    # --- broker.model.interfaces.ParameterComponent ---------------------------------------------------------
    def check(self, vhost: str, name: str, value: object, user: str | None) -> None:
        """As RabbitMQ's: a URI without a host (this node) names a vhost that exists, and that the user setting the
        shovel may use; a shovel cannot reach further for its user than the user itself can."""
        shovel = checked(vhost, name, value)
        if user is None:
            return
        for address in (*shovel.source.addresses(), *shovel.destination.addresses()):
            if address.local and (address.vhost not in self.node.vhosts
                                  or (address.vhost, user) not in self.node.permissions):
                raise DefinitionError([f'user "{user}" may not connect to vhost "{address.vhost}"'])

    def changed(self, vhost: str, name: str, value: object) -> None:
        running = self._stop_one(vhost, name)
        if value is not None and self.started and self.node.serves(vhost):
            self._start_one(vhost, name, value)
        elif value is None and running is not None:  # deleted
            self._keep(running.delete_exchange_queue())

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
        entries = {**{key: shovel.status() for key, shovel in self.running.items()}, **self.unusable}
        return [entry for key, entry in sorted(entries.items()) if vhost is None or key[0] == vhost]

    def restart(self, vhost: str, name: str) -> bool:
        """Start a shovel again (a terminated one at once); False if none runs here by that name."""
        if (vhost, name) not in self.running and (vhost, name) not in self.unusable:
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
            self.unusable[(vhost, name)] = {**status_entry(vhost, name, time.time()), "state": "terminated",
                                            "reason": f"failed to parse configuration: {error}"}
            return
        self.running[(vhost, name)] = RunningShovel(shovel, self.cluster_name, self.local, self._done)

    def _stop_one(self, vhost: str, name: str) -> RunningShovel | None:
        self.unusable.pop((vhost, name), None)
        running = self.running.pop((vhost, name), None)
        if running is not None:
            running.stop()
        return running

    def _keep(self, work: Coroutine) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self.cleaning.add(task)  # (the loop keeps tasks by weak references)
        task.add_done_callback(self.cleaning.discard)

    def _done(self, shovel: Shovel) -> None:
        """A shovel moved all it was to (src-delete-after): its parameter goes, as RabbitMQ's does."""
        vhost = self.node.vhosts.get(shovel.vhost)
        if vhost is not None and (COMPONENT, shovel.name) in vhost.parameters:
            self.node.clear_parameter(shovel.vhost, COMPONENT, shovel.name)


def static_shovel(table: dict) -> dict:
    """The runtime parameter a [[shovels]] table of the config defines, as a definitions export holds it: its
    name, its vhost ("/" unless it names one) and the rest of its keys as the shovel's definition."""
    value = {key: item for key, item in table.items() if key not in ("name", "vhost")}
    return {"vhost": table.get("vhost", "/"), "component": COMPONENT, "name": table["name"], "value": value}
