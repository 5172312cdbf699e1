"""The Prometheus endpoint of several workers: the supervisor scrapes each worker's own endpoint (on an internal
socket) and adds their figures up into one text, as one broker's.

A series that several workers report (the node's totals, a protocol's counters, their shares of the memory limit)
is their sum, except the few that describe the node rather than count in it: its version and identity (named by
worker 0), its disk (the first worker's) and its uptime (the longest). A series that one worker alone reports (a
queue's, a channel's) is kept as it is.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client.utils import floatToGoString

from broker.management import http
from broker.management.prometheus import CONTENT_TYPE, identity_only

if TYPE_CHECKING:
    from broker.workers.api import WorkerApis

KEPT_FROM_THE_FIRST = frozenset(("rabbitmq_build_info", "rabbitmq_identity_info", "rabbitmq_disk_space_available_bytes",
                                 "rabbitmq_disk_space_available_limit_bytes"))
LONGEST = frozenset(("rabbitmq_erlang_uptime_seconds",))


PER_OBJECT_LABELS = ('{vhost="', '{channel="')  # the first label of a queue's series, or a channel's


class Family:
    """A metric family of the text format: its HELP and TYPE lines, then its series: added up (labels -> value),
    or, for a family of queues or channels, which each live in one worker, their lines as the workers wrote them."""

    def __init__(self, name: str, header: str):
        self.name = name
        self.header = header  # its "# HELP" and "# TYPE" lines
        self.series: dict[str, float] = {}  # a sample's name with its labels -> its value
        self.lines: list[str] = []  # the workers' text of a family of queues or channels

    def add(self, body: str, first: bool) -> None:
        """A worker's series of this family (``first``: the first worker's)."""
        if self.name in KEPT_FROM_THE_FIRST and not first:
            return  # the node's, whose name labels them (worker 0's)
        if body.startswith(tuple(self.name + labels for labels in PER_OBJECT_LABELS)):
            self.lines.append(body)
            return
        for line in body.splitlines():
            series, _, text = line.rpartition(" ")
            value = float(text)
            if series not in self.series:
                self.series[series] = value
            elif self.name in LONGEST:
                self.series[series] = max(self.series[series], value)
            else:
                self.series[series] += value

    def text(self) -> str:
        return self.header + "".join(self.lines) + "".join(
            f"{series} {floatToGoString(value)}\n" for series, value in self.series.items())


def merged(texts: list[str]) -> str:
    """The workers' texts as one, families in the first worker's order (then any only others have). A family
    starts at a line "# HELP name ..." (label values escape their line breaks, so no series line starts so)."""
    families: dict[str, Family] = {}
    for index, text in enumerate(texts):
        for block in ("\n" + text).split("\n# HELP ")[1:]:
            help_line, type_line, body = (block.split("\n", 2) + ["", ""])[:3]  # a family may have no series
            name = help_line.split(" ", 1)[0]
            family = families.get(name)
            if family is None:
                family = families[name] = Family(name, f"# HELP {help_line}\n{type_line}\n")
            if body:
                family.add(body if body.endswith("\n") else body + "\n", index == 0)  # (the split took its end)
    return "".join(family.text() for family in families.values())


def make_metrics_gateway_app(apis: "WorkerApis") -> web.Application:
    async def scrape(request: web.Request) -> web.Response:
        supervisor = apis.supervisor
        answers = await asyncio.gather(*(apis.ask(worker, request, metrics=True) for worker in supervisor.measured()))
        if not answers:  # (a clustered node that leads no group)
            config = supervisor.config
            node = http.worker_name(0, config.cluster_node_id, len(supervisor.workers))  # (as worker 0 names it)
            return web.Response(body=identity_only(node, config.cluster_name), headers={"Content-Type": CONTENT_TYPE})
        failed = next((answer for answer in answers if answer.status != 200), None)
        if failed is not None:
            return failed.response()
        # on a thread: the text of 10,000 queues is megabytes, and the API's requests wait on this event loop
        text = await asyncio.to_thread(lambda: merged([answer.body.decode() for answer in answers]).encode())
        return web.Response(body=text, headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/metrics", scrape)
    app.router.add_get("/metrics/per-object", scrape)
    return app
