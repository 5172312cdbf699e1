"""The management API of several workers: one listener, the supervisor's, in front of the usual API
(broker.management) that every worker runs on an internal socket.

A request goes where what it names lives: docs/workers.md's table (The management API and the metrics) says
where, and ``Gateway._handle`` does it.

Every worker checks the request's credentials itself; the client's address travels in a header that only the
internal socket's API believes (http.FORWARDED_CLIENT). Its answer says how they fared (http.LOGIN_OUTCOME): the
refused logins are counted here, for the whole node, and answered more and more slowly, as one process does.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from aiohttp import web

from broker.connection.login_throttle import LoginThrottle
from broker.connection.peer_log import PeerLog
from broker.management import guards, http
from broker.management.app import CONSOLE, VIEWS, console_page
from broker.management.forwarding import (
    NODE_ITSELF, Answer, ApiClient, Body, body_of, from_other_nodes, other_nodes_context, unavailable,
)
from broker.management.resources import listing, sorted_bindings
from broker.management.views.nodes import NOT_CLUSTERED, down_node
from broker.model.definitions import VHOST_SECTIONS, of_vhosts, vhosts_named
from broker.workers.board import CLUSTER_SECRET, known_key, nodes_of
from broker.workers.moving import MoveError
from broker.workers.placement import PlacementError

if TYPE_CHECKING:
    from broker.workers.supervisor import Supervisor

log = logging.getLogger(__name__)
peer_log = PeerLog(log)  # refused logins, a few lines per address at most

# Query parameters that shape a listing: applied here to the merged list, not by each worker to its share
SHAPING = ("page", "page_size", "name", "use_regex", "columns")

# Listings over every vhost, with how one worker orders them and whether they page
GATHERED: dict[str, tuple[Callable[[list[dict]], list[dict]], bool]] = {
    "/api/queues": (lambda items: http.sorted_by(items, "vhost", "name"), True),
    "/api/queues/{vhost}": (lambda items: http.sorted_by(items, "vhost", "name"), True),
    "/api/exchanges": (lambda items: http.sorted_by(items, "vhost", "name"), True),
    "/api/exchanges/{vhost}": (lambda items: http.sorted_by(items, "vhost", "name"), True),
    "/api/bindings": (sorted_bindings, False),
    "/api/connections": (lambda items: http.sorted_by(items, "name"), True),
    "/api/channels": (lambda items: http.sorted_by(items, "name"), True),
    "/api/consumers": (lambda items: items, False),
    "/api/vhosts/{vhost}/connections": (lambda items: http.sorted_by(items, "name"), True),
    "/api/vhosts/{vhost}/channels": (lambda items: http.sorted_by(items, "name"), True),
    "/api/consumers/{vhost}": (lambda items: items, False),
    "/api/vhosts": (lambda items: http.sorted_by(items, "name"), True),
    "/api/{kind}": (lambda items: http.sorted_by(items, "vhost", "name"), False),
    "/api/parameters": (lambda items: http.sorted_by(items, "vhost", "component", "name"), False),
    "/api/parameters/{component}": (lambda items: http.sorted_by(items, "vhost", "name"), False),
    "/api/shovels": (lambda items: http.sorted_by(items, "vhost", "name"), False),
    "/api/federation-links": (lambda items: http.sorted_by(items, "vhost"), False),
    "/api/federation-links/state/down": (lambda items: http.sorted_by(items, "vhost"), False),
}
# Listings of clients, each served by one worker: every worker's are kept (with [server] spread_vhosts, a vhost's
# clients are on every worker)
CLIENTS = frozenset(("/api/connections", "/api/channels", "/api/consumers", "/api/vhosts/{vhost}/connections",
                     "/api/vhosts/{vhost}/channels", "/api/consumers/{vhost}"))
FOUND_ON_ONE = frozenset(("/api/connections/{name}", "/api/connections/{name}/channels", "/api/channels/{name}"))
QUEUE = "/api/queues/{vhost}/{name}"  # one queue: with spread_vhosts, its consumers are on every worker
QUEUES = frozenset(("/api/queues", "/api/queues/{vhost}"))  # with spread_vhosts, each queue as its owner counts it
# With spread_vhosts, a delayed exchange's messages wait in the worker they were published through: counted on each
EXCHANGE = "/api/exchanges/{vhost}/{name}"
EXCHANGES = frozenset(("/api/exchanges", "/api/exchanges/{vhost}"))
GROUP = "/api/vhosts/{vhost}/group"  # a vhost's data moved to another worker's group (PUT), by the supervisor
QUEUE_GROUP = "/api/queues/{vhost}/{name}/group"  # one queue's, the same way
MAINTENANCE = "/api/nodes/{name}/maintenance"  # PUT: the node drained; DELETE: revived (by the supervisor)
NODES = "/api/nodes"  # a worker's answer: its own entry (a node per worker), following its group's leader or not
NODE = "/api/nodes/{name}"  # GET: one of every node's workers; DELETE: a node that left the cluster, forgotten
# Node-wide changes: made on every worker (PUT and DELETE; the import of a whole node's definitions is POSTed)
EVERYWHERE = frozenset(("/api/users/{name}", "/api/permissions/{vhost}/{user}",
                        "/api/topic-permissions/{vhost}/{user}", "/api/vhosts/{vhost}"))
FAILING_FIRST = frozenset(("/api/health/checks/alarms", "/api/health/checks/local-alarms",
                           "/api/health/checks/virtual-hosts"))  # checks that fail if any worker's fails


def refusal_reason(response: web.StreamResponse) -> str:
    """What a worker's refusal of a request's credentials says (RabbitMQ's error body: {"reason": ...})."""
    try:
        return str(json.loads(getattr(response, "body", b""))["reason"])
    except (ValueError, TypeError, KeyError):
        return "?"


class WorkerApis(ApiClient):
    """Requests to the workers' internal API sockets, and on a clustered node to the other nodes' APIs."""

    def __init__(self, supervisor: "Supervisor"):
        super().__init__(lambda: supervisor.board.entries.get(CLUSTER_SECRET), other_nodes_context(supervisor.config))
        self.supervisor = supervisor

    async def ask(self, worker: int, request: web.Request, body: Body = None, metrics: bool = False,
                  **options: Any) -> Answer:
        """The worker's answer to request (ApiClient.ask_at's, with its options), from its management API or, with
        metrics, its Prometheus endpoint; on a clustered node, from the worker that leads its group, here or on
        another node (whose API is asked, proven, for that worker's answer)."""
        await self.supervisor.leader_named(worker)
        target = self.supervisor.api_target(worker, metrics)
        if target is None:
            return unavailable(f"worker {worker}", request, ConnectionError(f"no node leads group {worker} now"))
        return await self.ask_at(target, worker, request, body, **options)

class Gateway:
    """The public API's one handler: what goes where (see the module's text)."""

    def __init__(self, supervisor: "Supervisor"):
        self.supervisor = supervisor
        self.apis = WorkerApis(supervisor)
        self.failed_logins = LoginThrottle()  # refused API logins per address, counted for every worker
        # the node names each other node of the cluster last listed for its workers (shown again while it is down)
        self.names: dict[str, list[str]] = {}
        self.routes = web.Application()  # the usual API's routes, to tell what a path names
        for view in VIEWS:
            self.routes.add_routes(view.routes)

    @property
    def workers(self) -> range:
        return range(len(self.supervisor.workers))

    def leader_of(self, vhost: str) -> int:
        return self.supervisor.placement.of(vhost)

    async def for_a_group(self, request: web.Request, group: int | str, _handler=None) -> web.StreamResponse:
        """A request another node of the cluster forwarded (proven) for this node's worker that leads a group: that
        worker's answer, with how the credentials fared, for the node that asked to count."""
        check_only = request.headers.get(http.CHECK_ONLY) == "1"
        client = request.headers.get(http.FORWARDED_CLIENT, "")
        if group == NODE_ITSELF:  # this node's own workers, for the list of the cluster's nodes
            return http.reply(self.entries(await self.own_nodes(request, client)))
        if not isinstance(group, int) or group not in self.workers or not isinstance(
                self.supervisor.api_target(group), str):
            return http.error_response(503, "service_unavailable", f"this node does not lead group {group} now")
        answer = await self.apis.ask(group, request, body_of(request), check_only=check_only, client=client,
                                     body_key=request.get(http.BODY_KEY))
        response = answer.response()
        if http.LOGIN in request:
            response.headers[http.LOGIN_OUTCOME] = request[http.LOGIN]
        return response

    async def handle(self, request: web.Request) -> web.StreamResponse:
        supervisor = self.supervisor
        await supervisor.leader_named(0)
        if supervisor.api_target(0) is None:
            # No node leads group 0, which every change starts with: worker 0 answers 503 and why, with or without
            # credentials, so that a health check tells this node from one that is down or one that serves
            return (await self.apis.ask_at(supervisor.workers[0].api_path, 0, request, body_of(request))).response()
        refused = http.without_credentials(request)  # (answered here: every worker could only refuse it)
        if refused is not None:
            return refused
        try:
            response = await self._handle(request)
        except http.ApiError as error:  # a listing's shape asked for here (a page out of range...)
            response = error.response()
        except PlacementError as error:  # new vhosts that cannot be recorded now (before any worker made them)
            response = http.error_response(503, "service_unavailable", str(error))
        address = request.remote or ""
        if request.get(http.LOGIN) == "refused":  # logged, counted and waited for once, however many workers refused
            peer_log.warning(address, "HTTP login refused from %s: %s", address, refusal_reason(response))
            await asyncio.sleep(self.failed_logins.refused(address, self.supervisor.config.failed_login_delay))
        elif request.get(http.LOGIN) == "accepted":
            self.failed_logins.accepted(address)
        return response

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        match = await self.routes.router.resolve(request)
        resource = match.route.resource
        pattern = resource.canonical if resource is not None else ""
        vhost = match.get("vhost")
        method = request.method
        if method in ("PUT", "DELETE") and pattern in EVERYWHERE:
            return await self.everywhere(request, pattern, vhost)
        if method == "PUT" and pattern in (GROUP, QUEUE_GROUP) and vhost is not None:
            return await self.move(request, vhost, match.get("name"))
        if method == "POST" and pattern == "/api/definitions":
            return await self.import_everywhere(request)
        if method in ("PUT", "DELETE") and pattern == MAINTENANCE:
            return await self.maintenance(request, match["name"])
        spread = self.supervisor.config.spread_vhosts
        if vhost is not None and method == "GET" and (pattern in CLIENTS or spread and pattern in QUEUES | EXCHANGES):
            return await self.gathered(request, pattern)
        if vhost is not None and method == "GET" and spread and pattern in (QUEUE, EXCHANGE):
            return await self.one_everywhere(request, vhost, pattern)
        if vhost is not None:
            await self.supervisor.learn(vhost)
            return (await self.apis.ask(self.leader_of(vhost), request, body_of(request))).response()
        if pattern in (NODES, NODE) and method == "GET":
            return await self.nodes(request, match.get("name"))
        if pattern == NODE and method == "DELETE":
            return await self.forget_node(request, match["name"])
        if pattern in FOUND_ON_ONE and method in ("GET", "DELETE"):  # (a connection is closed where it is)
            return await self.first_found(request)
        if method != "GET":
            return (await self.apis.ask(0, request, body_of(request))).response()
        if pattern in GATHERED:
            return await self.gathered(request, pattern)
        if pattern in FAILING_FIRST or pattern in ("/api/overview", "/api/definitions"):
            return await self.from_every_worker(request, pattern)
        return (await self.apis.ask(0, request)).response()

    async def _each(self, ask: Callable[[int], Awaitable[Answer]]) -> list[Answer]:
        return list(await asyncio.gather(*(ask(worker) for worker in self.workers)))

    async def _after_first(self, request: web.Request, first: Answer, bodies: dict[int, bytes]) -> web.Response:
        """The other workers make the change the first one accepted; the first one's answer is the reply."""
        if first.status >= 400:
            return first.response()
        try:
            for worker in self.workers[1:]:
                answer = await self.apis.ask(worker, request, bodies[worker])
                if answer.status >= 400:
                    log.error("worker %d refused %s %s that worker 0 accepted: %d %s", worker, request.method,
                              request.path, answer.status, answer.body[:300])
                    return answer.response()
            return first.response()
        finally:
            await self.supervisor.node_wide_changed()

    async def everywhere(self, request: web.Request, pattern: str, vhost: str | None) -> web.Response:
        """A node-wide change, made on every worker, worker 0 first. A vhost made or deleted is first checked by
        worker 0 (the credentials, the administrator tag, the body): a refused request neither writes the placement
        nor changes it. Then, under the supervisor's lock of the vhosts, a new one is placed before any worker makes
        it, a deleted one forgotten once deleted."""
        kept = bytearray()
        if pattern != "/api/vhosts/{vhost}" or vhost is None:
            first = await self.apis.ask(0, request, body_of(request, kept))
            return await self._after_first(request, first, {worker: bytes(kept) for worker in self.workers})
        checked = await self.apis.ask(0, request, body_of(request, kept), check_only=True)
        if checked.status >= 300:
            return checked.response()
        body = bytes(kept)
        async with self.supervisor.changing_vhosts:
            placed = await self.supervisor.place([vhost]) if request.method == "PUT" else []
            first = await self.apis.ask(0, request, body)
            response = await self._after_first(request, first, {worker: body for worker in self.workers})
            # (a placement made here goes if worker 0 refuses after all, its user deleted meanwhile: under the lock,
            # no other request can have made the vhost in between)
            if first.status >= 400:
                await self.supervisor.forget(placed)
            elif request.method == "DELETE" and response.status < 300:
                await self.supervisor.forget([vhost])
            return response

    async def import_everywhere(self, request: web.Request) -> web.Response:
        """A whole node's definitions: node-wide ones to every worker, each vhost's to its leader. Worker 0 first
        checks the request as one process would (credentials, size, shape); then, under the supervisor's lock of
        the vhosts, the new vhosts are placed, each worker checks its share, and all is applied or the placements
        made for it are forgotten."""
        kept = bytearray()
        answer = await self.apis.ask(0, request, body_of(request, kept), check_only=True)
        if answer.status >= 400:
            return answer.response()
        async with self.supervisor.changing_vhosts:
            document = json.loads(kept)
            # Placed before the check: the check of an item of a new vhost is its leader's
            placed = await self.supervisor.place(vhosts_named(document))
            # each vhost's items go to its leader (those of a vhost no worker leads to worker 0, which refuses them)
            named = {item["vhost"] for section in VHOST_SECTIONS if isinstance(document.get(section), list)
                     for item in document[section] if isinstance(item, dict) and isinstance(item.get("vhost"), str)}
            shares = {worker: {name for name in named if self.leader_of(name) == worker} for worker in self.workers}
            bodies = {worker: json.dumps(of_vhosts(document, shares[worker])).encode() for worker in self.workers}
            for worker in self.workers:  # every share checked before any is applied: all or nothing, as one worker
                answer = await self.apis.ask(worker, request, bodies[worker], check_only=True)
                if answer.status >= 400:
                    await self.supervisor.forget(placed)
                    return answer.response()
            first = await self.apis.ask(0, request, bodies[0])
            if first.status >= 400:
                await self.supervisor.forget(placed)
            return await self._after_first(request, first, bodies)

    async def gathered(self, request: web.Request, pattern: str) -> web.Response:
        order, pageable = GATHERED[pattern]
        items = await self._gathered_items(request, pattern, order)
        if isinstance(items, web.Response):
            return items
        return await listing(request, items, pageable)

    async def _gathered_items(self, request: web.Request, pattern: str,
                              order: Callable[[list[dict]], list[dict]] | None = None) -> list[dict] | web.Response:
        """The items of every worker's listing, each once (as its vhost's leader lists it), in order when one is
        given; or the first refusal among the answers. They are decoded, kept and ordered on a thread, which hands
        the interpreter back to the event loop every few milliseconds (100,000 queues of two workers, decoded here,
        held every other API request 0.6 to 1.2 s)."""
        query = {key: value for key, value in request.query.items() if key not in SHAPING}
        path_qs = str(request.rel_url.with_query(query))
        answers = await self._each(lambda worker: self.apis.ask(worker, request, path_qs=path_qs))
        refused = next((answer for answer in answers if answer.status != 200), None)
        if refused is not None:
            return refused.response()
        return await asyncio.to_thread(self._merged, pattern, answers, order)

    def _merged(self, pattern: str, answers: list[Answer], order: Callable[[list[dict]], list[dict]] | None
                ) -> list[dict]:
        """_gathered_items' items from the workers' answers (run on a thread)."""
        items: list[dict] = []
        by_owner = pattern in QUEUES and self.supervisor.config.spread_vhosts
        key = "name" if pattern == "/api/vhosts" else "vhost"
        bodies = [answer.json_for_a_thread() for answer in answers]
        for worker, body in zip(self.workers, bodies):
            items += [item for item in body if pattern in CLIENTS or not isinstance(item.get(key), str)
                      or (http.worker_named(str(item.get("node")), len(self.workers)) == worker if by_owner
                          else self.leader_of(item[key]) == worker)]
        if pattern in EXCHANGES and self.supervisor.config.spread_vhosts:
            _count_delayed_everywhere(items, bodies)
        return items if order is None else order(items)

    async def one_everywhere(self, request: web.Request, vhost: str, pattern: str) -> web.Response:
        """One queue or exchange of a vhost every worker serves ([server] spread_vhosts), as the vhost's worker
        shows it: a queue as its owner counts it, with the consumers of every worker (each lists its own clients'); an
        exchange with the messages a delayed one holds in every worker."""
        answers = await self._each(lambda worker: self.apis.ask(worker, request))
        home = answers[self.leader_of(vhost)]
        if home.status != 200:
            return home.response()
        bodies = [answer.json() if answer.status == 200 else None for answer in answers]  # (each decoded once)
        shown = bodies[self.leader_of(vhost)]
        found = [body for body in bodies if body is not None]
        if pattern == EXCHANGE:
            _count_delayed_everywhere([shown], found)
            return http.reply(shown)
        owner = http.worker_named(str(shown.get("node")), len(self.workers))
        queue = bodies[owner] if owner is not None and bodies[owner] is not None else shown
        queue["consumer_details"] = [consumer for body in found for consumer in body.get("consumer_details", [])]
        queue["consumers"] = len(queue["consumer_details"])
        return http.reply(queue)

    async def move(self, request: web.Request, vhost: str, queue: str | None) -> web.Response:
        """A vhost, or a durable queue of it, moved to another worker's group: the worker that leads the vhost checks
        the request (credentials, the vhost, the group named, a queue's move: cluster.worker's check_queue_move; a
        cluster's refuses) and names a queue's owner, then the supervisor moves it."""
        kept = bytearray()
        home = self.leader_of(vhost)
        answer = await self.apis.ask(home, request, body_of(request, kept))
        if answer.status >= 300:
            return answer.response()
        target = json.loads(kept)["group"]
        what = "vhost" if queue is None else "queue"
        try:
            if queue is None:
                await self.supervisor.move(vhost, target)
            else:
                shown = await self.apis.ask(home, request, b"", method="GET",
                                            path_qs=request.raw_path.partition("?")[0].removesuffix("/group"))
                if shown.status != 200:
                    return shown.response()
                source = http.worker_named(str(shown.json().get("node")), len(self.workers))
                if source is None:
                    raise MoveError(f"its owner, {shown.json().get('node')!r:.100}, is not a worker of this node")
                await self.supervisor.move(vhost, target, queue, source)
        except (MoveError, OSError) as error:
            log.error("could not move %s to worker %d: %s", f"vhost '{vhost}'" if queue is None else
                      f"queue '{queue}' of vhost '{vhost}'", target, error)
            return http.error_response(500, "internal_server_error", f"the {what} could not be moved: {error}")
        return web.Response(status=204)

    async def nodes(self, request: web.Request, name: str | None) -> web.Response:
        """Every worker of this node, and on a clustered node of every node registered in the cluster (as RabbitMQ
        lists every node of its cluster), running or not: the credentials checked by a worker leading a group (the
        first group's leader that answers, wherever it runs)."""
        own = await self.own_nodes(request)
        verdict = await self._checked_by_a_leader(request)
        if verdict.status != 200:
            return verdict.response()
        items = self.entries(own)
        here = self.supervisor.config.cluster_node_id
        workers = len(self.workers)
        board = self.supervisor.board.entries
        members = nodes_of(board, workers)  # (none outside a cluster)
        others = [(node, (address["host"], address["api"])) for node, address in members.items()
                  if node != here and address["api"]]
        answers = await asyncio.gather(*(self.apis.ask_at(target, NODE_ITSELF, request, path_qs=NODES, method="GET")
                                         for _, target in others))
        answered = set()
        for (node, _), answer in zip(others, answers):
            if answer.status == 200:  # (a node that does not answer is logged, and listed as not running)
                entries = answer.json()
                items += entries
                answered.add(node)
                self.names[node] = [entry.get("name", "") for entry in entries]
        for node in sorted(set(nodes_of(board, workers, known_key)) - answered - {here}):
            items += [down_node(name) for name in self.names_of(node)]
        items = http.sorted_by(items, "name")
        if name is None:
            return await listing(request, items, pageable=False)
        found = [item for item in items if item.get("name") == name]
        if not found:
            raise http.not_found()
        return http.reply(found[0])

    def names_of(self, node: str) -> list[str]:
        """The names /api/nodes gives the workers of a node of the cluster: as it last answered for them, else as
        this host would name them."""
        workers = len(self.workers)
        return self.names.get(node) or [http.worker_name(worker, node, workers) for worker in range(workers)]

    async def _refused_outside_a_cluster(self, request: web.Request, what: str) -> web.Response | None:
        """The refusal of an operator's request on a node of the cluster (``what`` it asks): as a group's leader
        answers it (an administrator's), or 400 outside a cluster; None when the supervisor may do it."""
        body = await request.read() if request.body_exists else None  # (read once: it may be sent to several)
        verdict = await self._checked_by_a_leader(request, path_qs=request.path_qs, body=body, check_only=True)
        if verdict.status >= 300:
            return verdict.response()
        if not self.supervisor.clustered:
            return http.error_response(400, "bad_request", NOT_CLUSTERED.format(what))
        return None

    async def maintenance(self, request: web.Request, name: str) -> web.Response:
        """This node put in maintenance (PUT) or revived (DELETE): the request checked by a group's leader (an
        administrator's), then done by the supervisor; a drain answers once other nodes lead this node's groups."""
        if (refused := await self._refused_outside_a_cluster(request, "maintenance mode")) is not None:
            return refused
        here = self.supervisor.config.cluster_node_id
        names = {here, *(http.worker_name(worker, here, len(self.workers)) for worker in self.workers)}
        if name not in names:
            return http.error_response(400, "bad_request", f"{name[:200]!r} does not name this node ({here}): a node "
                                       "is put in maintenance, or revived, through its own API")
        failure = await self.supervisor.drain(request.method == "PUT")
        if failure:
            return http.error_response(503, "service_unavailable", failure)
        return web.Response(status=204)

    async def forget_node(self, request: web.Request, name: str) -> web.Response:
        """A node that left the cluster for good forgotten (``warrenctl forget_cluster_node``), named as /api/nodes
        names any of its workers, or by its node id: the request checked by a group's leader (an administrator's),
        then done by the supervisor in every group."""
        if (refused := await self._refused_outside_a_cluster(request, "forgetting a node")) is not None:
            return refused
        node = self.node_named(name)
        if node is None:
            raise http.not_found()
        if node == self.supervisor.config.cluster_node_id:
            return http.error_response(400, "bad_request", f"node {node} is this node: a node is forgotten through "
                                       "another node's API, once it is stopped for good")
        answer = await self.supervisor.forget_node(node)
        if "refused" in answer:
            status, error = (400, "bad_request") if answer.get("still_needed") else (503, "service_unavailable")
            return http.error_response(status, error, str(answer["refused"]))
        log.info("node %s forgotten: it left the cluster", node)
        return web.Response(status=204)

    def node_named(self, name: str) -> str | None:
        """The id of the node of the cluster that ``name`` names (as /api/nodes names one of its workers, with its
        host or without, or by the node's id), of those that ever registered; None if none."""
        for node in nodes_of(self.supervisor.board.entries, len(self.workers), known_key):
            names = self.names_of(node)
            if name == node or name in names or name in (shown.partition("@")[0] for shown in names):
                return node
        return None

    async def _checked_by_a_leader(self, request: web.Request, path_qs: str = NODES, body: bytes | None = None,
                                   check_only: bool = False) -> Answer:
        """The request (/api/nodes by default) as a group's leader takes it: one of this node's workers that leads
        (no network), or, where none does or it cannot answer, every group's leader at once, the first that does
        not answer 503."""
        def ask(worker: int) -> Awaitable[Answer]:
            return self.apis.ask(worker, request, body, path_qs=path_qs, check_only=check_only)
        here = [worker for worker in self.workers if isinstance(self.supervisor.api_target(worker), str)]
        if here:
            answer = await ask(here[0])
            if answer.status != 503:
                return answer
        answers = await self._each(ask)
        return next((answer for answer in answers if answer.status != 503), answers[0])

    async def own_nodes(self, request: web.Request, client: str | None = None) -> list[Answer]:
        """Each worker of this node's own entry in /api/nodes (a GET, for a HEAD too: its entries are read), its
        internal socket asked whether or not it leads, without credentials (the caller has them checked)."""
        return await self._each(lambda worker: self.apis.ask_at(
            self.supervisor.workers[worker].api_path, NODE_ITSELF, request, path_qs=NODES, client=client,
            method="GET"))

    def entries(self, answers: list[Answer]) -> list[dict]:
        """The /api/nodes entries of this node's workers, from their answers: one that did not answer is stopped,
        or starting again."""
        node = self.supervisor.config.cluster_node_id or "warren"
        return [entry for worker, answer in zip(self.workers, answers) for entry in (
            answer.json() if answer.status == 200 else
            [{"name": http.worker_name(worker, node, len(self.workers)), "type": "disc", "running": False}])]

    async def first_found(self, request: web.Request) -> web.Response:
        """The answer of the worker that has the connection or channel (each worker answers for its own): a 2xx
        where one has it, else the refusal (RabbitMQ's 401 to a user who may not see it, found or not) or 404."""
        answers = await self._each(lambda worker: self.apis.ask(worker, request))
        found = next((answer for answer in answers if 200 <= answer.status < 300), None)
        return (found or next((answer for answer in answers if answer.status != 404), answers[0])).response()

    async def from_every_worker(self, request: web.Request, pattern: str) -> web.Response:
        """Every worker's answers made one reply: the first that is not a 200, or else the first worker's answer (a
        check that fails if any worker's fails), the overview or the definitions made of all of them."""
        answers = await self._each(lambda worker: self.apis.ask(worker, request))
        failed = next((answer for answer in answers if answer.status != 200), None)
        if failed is not None or pattern in FAILING_FIRST:
            return (failed or answers[0]).response()
        if pattern == "/api/overview":
            return await self.overview(request, answers)
        return await self.definitions(request, answers)

    async def overview(self, request: web.Request, answers: list[Answer]) -> web.Response:
        data = answers[0].json()
        for answer in answers[1:]:
            other = answer.json()
            for section in ("queue_totals", "object_totals", "message_stats"):
                data[section] = summed(data.get(section, {}), other.get(section, {}))
        exchanges = await self._gathered_items(request.clone(rel_url=request.rel_url.with_path("/api/exchanges")
                                                             .with_query({"columns": "vhost"})), "/api/exchanges")
        if isinstance(exchanges, web.Response):
            return exchanges
        data["object_totals"]["exchanges"] = len(exchanges)  # each vhost's from its leader alone
        # the node that answers, as RabbitMQ's overview names it (its first worker), not the leader that counted
        data["node"] = http.worker_name(0, self.supervisor.config.cluster_node_id, len(self.workers))
        return http.reply(data)

    async def definitions(self, request: web.Request, answers: list[Answer]) -> web.Response:
        """The node's definitions: worker 0's node-wide ones, each vhost's items from its leader, merged on a thread
        and written as they are encoded (as one worker writes its own)."""
        document = await asyncio.to_thread(self._definitions_of, answers)
        response = http.reply_in_slices(request, document)
        if "Content-Disposition" in answers[0].headers:  # (asked for as a file)
            response.headers["Content-Disposition"] = answers[0].headers["Content-Disposition"]
        return response

    def _definitions_of(self, answers: list[Answer]) -> dict:
        documents = [answer.json_for_a_thread() for answer in answers]
        document = documents[0]
        for section in VHOST_SECTIONS:
            document[section] = [item for worker, other in zip(self.workers, documents)
                                 for item in other.get(section, [])
                                 if not isinstance(item.get("vhost"), str) or self.leader_of(item["vhost"]) == worker]
        return document


def summed(one, other):
    """Two workers' figures added up: numbers added, objects field by field, rates' samples one by one (each at the
    older of the two times, so that a sample is as recent as both workers' figures in it), anything else kept from
    the first."""
    if isinstance(one, bool) or isinstance(other, bool):
        return one
    if isinstance(one, (int, float)) and isinstance(other, (int, float)):
        return one + other
    if isinstance(one, list) and isinstance(other, list) and all(
            isinstance(sample, dict) and "timestamp" in sample and "sample" in sample for sample in one + other):
        return [{"sample": mine["sample"] + theirs["sample"], "timestamp": min(mine["timestamp"], theirs["timestamp"])}
                for mine, theirs in zip(one, other)]
    if isinstance(one, dict) and isinstance(other, dict):
        return {key: summed(one[key], other[key]) if key in one and key in other else one.get(key, other.get(key))
                for key in {**one, **other}}
    return one


def make_gateway_app(supervisor: "Supervisor") -> web.Application:
    config = supervisor.config
    gateway = Gateway(supervisor)
    middlewares = [guards.same_origin]
    if supervisor.clustered:  # requests another node forwards for a worker here: neither their Host nor Origin is ours
        middlewares.insert(0, from_other_nodes(lambda: supervisor.board.entries.get(CLUSTER_SECRET), gateway.for_a_group))
    app = web.Application(middlewares=middlewares, client_max_size=config.management_max_body_size)
    app[guards.NAMES] = guards.allowed_names(config)
    app.on_response_prepare.append(guards.add_security_headers)

    app.router.add_get("/", console_page)
    app.router.add_static("/console/", CONSOLE)
    app.router.add_route("*", r"/api/{path:[\s\S]*}", gateway.handle)  # names may hold line breaks
    return app


def _count_delayed_everywhere(exchanges: list[dict], bodies: list) -> None:
    """Each delayed exchange's waiting messages: those of every worker's answer, decoded (an exchange, or a list of
    them)."""
    waiting: dict[tuple[str, str], int] = {}
    for body in bodies:
        for item in body if isinstance(body, list) else [body]:
            if isinstance(item, dict) and "messages_delayed" in item:
                key = (str(item.get("vhost")), str(item.get("name")))
                waiting[key] = waiting.get(key, 0) + int(item["messages_delayed"])
    for exchange in exchanges:
        if "messages_delayed" in exchange:
            exchange["messages_delayed"] = waiting.get((str(exchange.get("vhost")), str(exchange.get("name"))), 0)
