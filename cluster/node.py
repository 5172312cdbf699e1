"""One node of a cluster: follow the leader, or campaign and lead, as etcd decides.

A node grants itself an etcd lease and registers under ``members/``. While a leader is known it follows it: its data
dir receives the leader's writes (``ReplicaClient``), which its hot standby reads as they come (``storage.standby``),
and the node's front doors send the group's clients to the leader (cluster.worker); a follower that has not heard
from its leader for a while says so in its member key (``lost_leader``). When the leader key is gone, a node whose
data dir is one the ISR names (any node of a fresh cluster) campaigns; the winner checks that again, then promotes:
the store's recovery takes the standby's state and reads only what the standby had yet to (on a thread: the lease is
kept meanwhile), then the broker serves, ``ReplicationServer`` streaming to followers and gating confirms on them. A
node whose data dir the ISR does not name (wiped, replaced, damaged: a new identity) never campaigns; when no node
holding one of the ISR's data dirs is left, the cluster does not serve, and says so, until one returns or an
operator forces an unclean election (``python -m cluster force-leader --group K``).

A leader renews its lease only while the store's writer makes progress (a stuck disk lets the lease lapse), and
stops serving as soon as it cannot prove its lease is alive (``lease_ttl`` after the last renewal etcd confirmed),
etcd shows another leader, or it steps aside for want of min_insync copies. It then becomes a follower again, which
rewrites its data dir from the new leader.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from pathlib import Path
from typing import Callable, Protocol

from broker.config import Config, ConfigError, read_secret
from broker.connection.server import SHUTDOWN_GRACE, Server, StartupError
from broker.connection.tls import TlsError, node_contexts
from cluster.coordinator import Coordinator, CoordinatorError, CoordinatorUnavailable, Member, Replica, find_copy
from cluster.follower import ReplicaClient
from cluster.replication import LeadershipLost, ReplicationServer
from cluster.state import identity, read_epoch, write_epoch
from cluster.walkover import Unfollowed, WalkoverCoordinator
from storage.lock import DataDirLock, DataDirLocked
from storage.digests import RunningDigests
from storage.standby import Standby

log = logging.getLogger("cluster")

RETRY = 0.2  # seconds between attempts while etcd or the leader cannot be reached
REACH_POLL = 0.1  # seconds between looks at whether a follower hears its leader
DISK_RETRY = 5.0  # seconds a follower whose data dir failed waits before it connects again
STANDBY_HOLD = 1.0  # seconds a node whose hot standby is not whole lets one whose standby is campaign first
MAINTENANCE_POLL = 0.25  # seconds between looks at which nodes are in maintenance
PROGRESS_PROBE = "the store's writer has finished no batch nor compaction slice for {:.1f} s: the lease is not renewed"
IN_MAINTENANCE = "this node is in maintenance: it leads nothing until revived (`warrenctl revive`)"
UNHEALTHY = "the store's writes fail: the lease is not renewed, so that a node with a working disk takes over"


def make_coordinator(config: Config, group: int = 0) -> Coordinator:
    """The coordinator of one replication group: outside a cluster, a walkover; in one, etcd's, where group 0's keys
    are the cluster's own (a cluster of one group keeps them where they always were), group k's under groups/k."""
    if not config.cluster_etcd_endpoints:
        return WalkoverCoordinator(config.cluster_node_id)
    from cluster.etcd import EtcdCoordinator  # only a clustered node needs etcd's client

    root = f"/warren/{config.cluster_name}"
    return EtcdCoordinator(config.cluster_etcd_endpoints, root + (f"/groups/{group}" if group else ""),
                           config.cluster_node_id, config.cluster_lease_ttl, root=root)


class Group(Protocol):
    """The worker process whose replication group this is (cluster.worker): its broker, its front doors' routes,
    and its part in spreading the groups' leaders over the nodes."""

    number: int  # the group's number (its worker's)

    def server(self, config: Config) -> Server:
        """The broker to lead with: it serves the clients the front doors hand to it."""

    def announce(self, leader: Member | None) -> None:
        """Who leads the group as this node now knows it: this node once it serves, the leader it follows while it
        hears it, None otherwise."""

    def hold(self, candidates: list[str]) -> float:
        """Seconds to wait before campaigning (0: at once), given the other nodes that could lead the group."""

    def lighter(self, candidates: list[str]) -> str | None:
        """While this node leads the group: a node of candidates (members that could lead it) that leads at least
        two groups fewer than this node, to step aside for (None: the leaders are balanced)."""

    def learnt(self, secret: str) -> None:
        """The group's secret, as this node has just learnt it."""

    def maintenance(self, on: bool) -> None:
        """This node went into maintenance (on: its front doors drop their clients and take no new ones) or came
        back out of it."""


class ClusterNode:
    def __init__(self, config: Config, coordinator: Coordinator, group: Group) -> None:
        self.config = config
        self.group = group  # the worker whose replication group this is
        self.node = config.cluster_node_id
        self.data_dir = Path(config.data_dir)
        self.coordinator = coordinator
        self.ttl = coordinator.lease_ttl
        self.data_dir_identity = ""  # (cluster.state) read or made as the node starts: the ISR names copies by it
        advertised = config.cluster_advertise_host or config.host
        self.member = Member(self.node, advertised, config.port, advertised,
                             config.cluster_replication_port, management_port=config.management_port,
                             amqps_port=config.tls_port if config.tls_certfile else 0,
                             mqtt_port=config.mqtt_port, mqtt_tls_port=config.mqtt_tls_port)
        # [cluster] tls: this node's TLS towards the other nodes (the accepting side's context, the connecting side's)
        try:
            self.tls = node_contexts(config) if config.cluster_tls else None
        except TlsError as error:  # a file that cannot be used, named
            raise StartupError(str(error)) from error
        # what the replication stream's proofs are bound to: the cluster, and the group
        self.replication_group = f"{config.cluster_name}/{group.number}"
        self.secret = ""  # the cluster's shared secret (from etcd, or from secret_file)
        self.role = "starting"  # starting, follower, leader
        self.server: Server | None = None  # the broker, while leading
        # while following: the data dir's recovery kept up to date, for the broker to start from if this node leads
        self.standby: Standby | None = None
        # the data dir's files' digests, kept up to date by what follows or leads, so that a join need not hash them
        self.digests = RunningDigests(self.data_dir)
        self.waiting_for = ""  # why this node neither leads nor follows now ("": it does one or the other)
        self.drained: set[str] = set()  # the nodes in maintenance, as etcd last said (this one's own included)
        self._serving_since = 0.0  # monotonic time the broker started serving (the writer's progress counts after)
        self._proven_until = 0.0  # monotonic time until which the lease is known to be alive
        self._proof_timer: asyncio.TimerHandle | None = None  # ends leadership the moment the proof runs out
        self._lost: asyncio.Future[str] | None = None  # resolved with a reason when leadership must end
        self._campaign_after = 0.0  # monotonic time before which this node does not campaign (it stepped aside)
        self._leaderless_since = 0.0  # monotonic time this node first found no leader, since it last saw one
        self._joining = asyncio.Lock()  # one _join_cluster at a time (the lease keeper and a leadership's end)
        self._stopping = False
        # the levels of the lines that tell of the group's life, which a group of one leads without a word
        self.info, self.warning = (logging.INFO, logging.WARNING) if coordinator.followed else (logging.DEBUG,) * 2

    # --- the node's life ------------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Follow or lead until ``stop`` is set."""
        life = asyncio.ensure_future(self._live())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({life, stopping}, return_when=asyncio.FIRST_COMPLETED)
        self._stopping = True
        if self._lost is not None and not self._lost.done():
            self._lost.set_result("the node is shutting down")
            await asyncio.wait({life}, timeout=10)
        life.cancel()
        stopping.cancel()
        if self.standby is not None:
            self.standby.stop()
        await self.coordinator.close()
        error = life.exception() if life.done() and not life.cancelled() else None
        if error is not None:
            raise error  # the process exits with the error, so that a supervisor restarts it

    async def _live(self) -> None:
        self.data_dir_identity = await asyncio.get_running_loop().run_in_executor(None, identity, self.data_dir)
        self.member = dataclasses.replace(self.member, dir=self.data_dir_identity)
        log.log(self.info, "data dir %s has identity %s", self.data_dir, self.data_dir_identity)
        await self._join_cluster()
        keeper = asyncio.ensure_future(self._keep_lease())
        while not await self._look_at_maintenance():  # (known before the first campaign)
            await asyncio.sleep(RETRY)
        maintenance = asyncio.ensure_future(self._watch_maintenance())
        try:
            while not self._stopping:
                try:
                    await self._step()
                except CoordinatorUnavailable as error:
                    log.warning("etcd unreachable: %s", error)
                    await asyncio.sleep(RETRY)
                except CoordinatorError as error:  # a damaged key or a lapsed lease: said once per attempt
                    log.error("cannot take part in the cluster: %s", error)
                    await asyncio.sleep(RETRY * 5)
        finally:
            keeper.cancel()
            maintenance.cancel()

    async def _join_cluster(self) -> None:
        """Grant a lease, learn the secret, register; retrying until etcd answers. A join already under way when
        this one is asked for does the work for both."""
        if self._joining.locked():
            async with self._joining:
                return
        async with self._joining:
            said = ""  # the last failure logged: one line per kind of failure, not one per attempt
            started = time.monotonic()
            while True:
                try:
                    asked = time.monotonic()
                    await self.coordinator.start()
                    self._renewed(asked)
                    self.secret = await self._learn_secret()
                    self.group.learnt(self.secret)
                    await self.coordinator.register(self.member)
                    if said:
                        log.info("joined the cluster through etcd after %.1f s", time.monotonic() - started)
                    return
                except CoordinatorError as error:
                    if str(error) != said:
                        log.warning("cannot join the cluster through etcd yet (trying every %.1f s): %s", RETRY,
                                    error)
                        said = str(error)
                    await asyncio.sleep(RETRY)

    async def _learn_secret(self) -> str:
        """The secret [cluster] secret_file holds, or else the one etcd keeps (made by the first node to ask)."""
        if not self.config.cluster_secret_file:
            return await self.coordinator.secret()
        try:
            return read_secret(self.config.cluster_secret_file)
        except ConfigError as error:  # (read at start already: it changed since)
            raise StartupError(str(error)) from None

    async def _step(self) -> None:
        current = await self.coordinator.leader()
        if current is not None or not self._leaderless_since:
            self._leaderless_since = time.monotonic() if current is None else 0.0
        if current is None:
            replicas = await self.coordinator.replicas()
            if self.in_maintenance:
                if self.waiting_for != IN_MAINTENANCE:
                    log.warning("not electable: %s", IN_MAINTENANCE)
                    self.waiting_for = IN_MAINTENANCE
            elif self._electable(replicas):
                hold = self._campaign_after - time.monotonic()  # the replica it stepped aside for first
                members = await self.coordinator.members()
                preferred = await self.coordinator.preferred()
                others = self._others_that_can_lead(members, replicas)
                if preferred is not None and preferred in others:
                    hold = max(hold, self.ttl)  # the node an operator asked for campaigns first
                elif preferred != self.node:
                    hold = max(hold, self.group.hold(others))
                if not self._standby_whole and any(members[node].standby for node in others):
                    # a node that serves without reading its data dir goes first (once in each election)
                    hold = max(hold, self._leaderless_since + STANDBY_HOLD - time.monotonic())
                if hold > 0:
                    await self.coordinator.wait_leader_change(None, hold)
                    return
                epoch = await self.coordinator.campaign(self.member)
                if epoch is not None:
                    await self._lead_or_resign(epoch)
                    return
            else:
                await self._say_why_not_electable(replicas or [])
            await self.coordinator.wait_leader_change(None, self.ttl)
            return
        leader, epoch = current
        if leader.node_id == self.node:  # won, but the answer was lost; or a key left by this node's previous run
            await self.coordinator.resign()  # deletes it only if bound to this run's lease
            await self.coordinator.wait_leader_change(epoch, self.ttl)
            return
        await self._follow(leader, epoch)

    def _electable(self, replicas: list[Replica] | None) -> bool:
        """Whether this node may lead: its data dir is one the ISR names (any node of a fresh cluster may), and
        holds at least the epoch the ISR says it held."""
        if replicas is None:
            return True
        mine = find_copy(replicas, self.node, self.data_dir_identity)
        return mine is not None and read_epoch(self.data_dir) >= mine.epoch

    async def _say_why_not_electable(self, replicas: list[Replica]) -> None:
        """Log, once per state, why this node does not campaign, and whether any node can."""
        named = ", ".join(f"{r.node} (data dir {r.dir})" for r in replicas) or "none"
        members = await self.coordinator.members()
        mine = find_copy(replicas, self.node, self.data_dir_identity)
        held = ("holds frames of an older epoch than the ISR says it acked: it was rolled back (a restored snapshot?)"
                if mine else f"({self.data_dir_identity}) is not one of the in-sync replicas ({named})")
        level = logging.WARNING
        if any(find_copy(replicas, member.node_id, member.dir) for member in members.values()
               if member.node_id != self.node):
            why = f"this node's data dir {held}: it waits for another to lead, then takes a copy"
        else:
            level = logging.ERROR
            why = (f"no node holding an in-sync replica ({named}) is running, and this node's data dir {held}: the "
                   "cluster cannot serve without losing confirmed messages. Start a node that holds one, or force an "
                   "unclean election, accepting the loss, with `python -m cluster force-leader --config FILE "
                   f"--group {self.group.number}` on the node to lead")
        if why != self.waiting_for:
            log.log(level, "not electable: %s", why)
            self.waiting_for = why

    # --- leading --------------------------------------------------------------------------------------------
    async def _lead_or_resign(self, epoch: int) -> None:
        replicas = await self.coordinator.replicas()
        # dropped from the ISR, or put in maintenance, while campaigning
        why = (f"its data dir is not in the ISR {[replica.node for replica in replicas or []]}"
               if not self._electable(replicas) else IN_MAINTENANCE if self.in_maintenance else "")
        if why:
            log.warning("won the election but %s: resigning", why)
            await self.coordinator.resign()
            return
        self.waiting_for = ""
        stepped_aside = False
        try:
            reason, stepped_aside = await self._lead(epoch)
        except Exception as error:  # say a data dir that cannot be recovered: another node may do better
            if not self.coordinator.followed:  # no other node can: the worker ends, and says why
                raise
            log.error("cannot lead: %s", error, exc_info=not isinstance(error, (OSError, StartupError)))
            reason = f"it could not start: {error}"
            await asyncio.sleep(RETRY * 5)
        log.log(self.warning, "stopped leading (epoch %d): %s", epoch, reason)
        if stepped_aside:
            self._campaign_after = time.monotonic() + self.ttl
        await self.coordinator.close()  # the lease goes, and the leader key with it (or it lapses by itself)
        if not self._stopping:
            await self._join_cluster()

    async def _lead(self, epoch: int) -> tuple[str, bool]:
        """Serve as the leader of ``epoch`` until leadership must end; returns why, and whether it stepped aside."""
        log.log(self.info, "leading the cluster (epoch %d)", epoch)
        self.role = "leader"
        self._lost = asyncio.get_running_loop().create_future()
        await asyncio.get_running_loop().run_in_executor(None, write_epoch, self.data_dir, epoch)
        server = self.group.server(self.config)
        server.standby, self.standby = self.standby, None  # (its recovery reads only what the standby has yet to)
        replication: ReplicationServer | Unfollowed = Unfollowed()
        if self.coordinator.followed:
            replication = ReplicationServer(
                server.store, self.coordinator, self.node, self.data_dir_identity, epoch, self.secret,
                self.config.cluster_min_insync, self.config.cluster_ack_timeout, self._lose, self.digests,
                self.replication_group)
        watcher = None
        try:
            await replication.start(self.config.host, self.config.cluster_replication_port,
                                    self.tls[0] if self.tls else None)
            await server.start()
            self._serving_since = time.monotonic()
            self.server = server
            replication.store_ready.set()
            self.group.announce(self.member)
            watcher = asyncio.ensure_future(self._watch_leader(
                epoch, functools.partial(self._lose, "etcd shows another leader"), leading=True))
            return await self._lost, replication.stepped_aside
        except LeadershipLost as error:
            return str(error), False
        finally:
            replication.halt()  # not one confirm more
            self.role = "starting"
            self.server = None
            self.group.announce(None)
            if watcher is not None:
                watcher.cancel()
            await server.stop(grace=SHUTDOWN_GRACE if self._stopping else 0)  # (a new leader serves: at once)
            await replication.stop()

    async def prefer(self, node: str | None) -> None:
        """An operator's wish: ``node`` leads from now on, after every election it can win (None: whichever node the
        election gives). The leader steps aside for it at once. CoordinatorError, or ValueError naming why
        ``node`` cannot lead (not a member, or no in-sync copy of the data)."""
        if node is not None:
            members, replicas = await self.coordinator.members(), await self.coordinator.replicas()
            if node not in members:
                raise ValueError(f"node {node!r} is not a member of the cluster now (members: "
                                 f"{', '.join(sorted(members)) or 'none'})")
            if not can_lead(node, members, replicas):
                raise ValueError(f"node {node!r} holds no in-sync copy of the group's data yet: it could not lead")
            if node in await self.coordinator.drained():
                raise ValueError(f"node {node!r} is in maintenance: revive it first")
        await self.coordinator.prefer(node)
        if node is not None and node != self.node and self.role == "leader":
            self._step_aside_for(node, "as an operator asked")

    def _others_that_can_lead(self, members: dict[str, Member], replicas: list[Replica] | None) -> list[str]:
        """The other members that could win an election now and are not in maintenance, those whose hot standby is
        whole first."""
        return sorted((node for node in members
                       if node != self.node and node not in self.drained and can_lead(node, members, replicas)),
                      key=lambda node: not members[node].standby)

    def _step_aside_for(self, node: str, why: str) -> None:
        self._campaign_after = time.monotonic() + self.ttl
        self._lose(f"node {node} is to lead, {why}")

    def _lose(self, reason: str) -> None:
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(reason)

    async def _watch_leader(self, epoch: int, changed: Callable[[], None], leading: bool = False) -> None:
        """changed() once etcd shows another leader than that of ``epoch``; leading, the leader steps aside as soon as
        an operator or the balance names another node."""
        while True:
            try:
                current = await self.coordinator.leader()
                if current is None or current[1] != epoch:
                    changed()
                    return
                if leading:
                    members, preferred = await self.coordinator.members(), await self.coordinator.preferred()
                    others = self._others_that_can_lead(members, await self.coordinator.replicas())
                    if preferred is not None and preferred in others:
                        self._step_aside_for(preferred, "as an operator asked")
                        return
                    if preferred is None and (lighter := self.group.lighter(others)):
                        self._step_aside_for(lighter, "which leads fewer groups (the leaders are balanced by count)")
                        return
                await self.coordinator.wait_leader_change(epoch, self.ttl / 2 if leading else self.ttl)
            except CoordinatorError:
                await asyncio.sleep(RETRY)

    @property
    def _standby_whole(self) -> bool:
        """Whether this node's hot standby holds all its data dir does (it has one while it follows, or followed)."""
        return self.standby is not None and self.standby.whole

    # --- maintenance ----------------------------------------------------------------------------------------
    @property
    def in_maintenance(self) -> bool:
        """An operator put this node in maintenance (``warrenctl drain``): it leads nothing until revived."""
        return self.node in self.drained

    async def _watch_maintenance(self) -> None:
        """Keep ``drained`` as etcd has it, and while this node is in maintenance hand any leadership to a node
        that can lead (one in sync, not in maintenance itself); without one it goes on leading, and says so once."""
        said = False  # that no other node could take the lead
        while True:
            await asyncio.sleep(MAINTENANCE_POLL)
            await self._look_at_maintenance()
            if not self.in_maintenance:
                said = False
            elif self.role == "leader":
                try:
                    members, replicas = await self.coordinator.members(), await self.coordinator.replicas()
                except CoordinatorError:
                    continue
                others = self._others_that_can_lead(members, replicas)
                if others:
                    self._step_aside_for(others[0], "as this node is in maintenance")
                elif not said:
                    log.warning("in maintenance, but no other node can lead the group (none holds an in-sync copy "
                                "out of maintenance): this node goes on leading it")
                    said = True

    async def _look_at_maintenance(self) -> bool:
        """Read which nodes are in maintenance, and tell the group if this one went in or came out; False if etcd
        did not answer."""
        was = self.in_maintenance
        try:
            self.drained = await self.coordinator.drained()
        except CoordinatorError:
            return False
        if self.in_maintenance != was:
            log.warning("this node is %s maintenance", "in" if self.in_maintenance else "out of")
            self.group.maintenance(self.in_maintenance)
        return True

    # --- the lease ------------------------------------------------------------------------------------------
    async def _keep_lease(self) -> None:
        """Renew every third of the TTL, counted from when the last renewal was asked for (a leader only while its
        disk makes progress); a leader that cannot prove its lease alive stops leading. A renewal that got no
        answer within its third (etcd slow, or this loop held meanwhile) is followed by the next at once, so that
        the lease outlives one lost renewal."""
        due = time.monotonic() + self.ttl / 3  # when the next renewal is asked for
        while True:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            self._check_proof()  # first of all after a pause (SIGSTOP, a frozen VM): the lease may be gone
            asked = time.monotonic()
            due = asked + self.ttl / 3
            server = self.server
            if server is not None:
                server.store.when_durable(lambda ok: None)  # an idle store still proves its writer turns over
                stalled = asked - max(server.store.writer_progress(), self._serving_since)
                if stalled > self.ttl / 2 or not server.store.healthy:
                    log.error(PROGRESS_PROBE.format(stalled) if server.store.healthy else UNHEALTHY)
                    self._check_proof()
                    continue
            try:
                alive = await asyncio.wait_for(self.coordinator.refresh(), self.ttl / 3)
            except (CoordinatorUnavailable, asyncio.TimeoutError):
                alive = None
            if alive:
                self._renewed(asked)
            elif alive is False and not self.coordinator.lease_alive:  # not merely a slow answer
                self._lose("the etcd lease expired")
                if self.role != "leader":
                    await self._join_cluster()
            self._check_proof()

    def _renewed(self, asked: float) -> None:
        """etcd renewed the lease when asked at ``asked``: it lives at least lease_ttl from then."""
        self._proven_until = asked + self.ttl
        if self._proof_timer is not None:
            self._proof_timer.cancel()
        self._proof_timer = asyncio.get_running_loop().call_later(
            self._proven_until - time.monotonic(), self._check_proof)

    def _check_proof(self) -> None:
        if self.role == "leader" and time.monotonic() >= self._proven_until:
            self._lose("the etcd lease can no longer be proven alive")

    # --- following ------------------------------------------------------------------------------------------
    async def _follow(self, leader: Member, epoch: int) -> None:
        """Receive the leader's writes and forward clients to it, until etcd shows another leader."""
        lock = DataDirLock(self.data_dir)
        try:
            lock.acquire()
        except DataDirLocked as error:
            log.error("%s: waiting", error)
            await asyncio.sleep(RETRY * 5)
            return
        self.role = "follower"
        log.info("following %s (epoch %d)", leader.node_id, epoch)
        self.waiting_for = ""
        if self.standby is None:
            self.standby = Standby(self.data_dir)
            self.standby.start()
        self.standby.follows(epoch)
        client = ReplicaClient(self.data_dir, self.node, self.secret, self.config.cluster_ack_timeout,
                               self.tls[1] if self.tls else None, self.replication_group, self.standby.applied,
                               self.digests)
        changed = asyncio.Event()
        watcher = asyncio.ensure_future(self._watch_leader(epoch, changed.set))
        teller = asyncio.ensure_future(self._tell_how_it_follows(client, epoch))
        announcer = asyncio.ensure_future(self._announce_while_heard(client, leader))
        said = ""  # the failure last logged: the same one again, at each retry, is not (five lines a second)
        try:
            while not changed.is_set():
                began = time.monotonic()
                stream = asyncio.ensure_future(client.follow(leader.replication_host, leader.replication_port, epoch))
                waiter = asyncio.ensure_future(changed.wait())
                await asyncio.wait({stream, waiter}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                if not stream.done():
                    client.stop()
                    await stream
                elif client.failure or stream.exception():  # (an error not foreseen is retried as a failure)
                    failure = client.failure or repr(stream.exception())
                    # (a failing disk is not retried at once: each try may take a whole copy)
                    pause = DISK_RETRY if client.disk_failed else RETRY
                    if failure != said or client.heard_at >= began:  # (news, or the leader spoke in between)
                        log.log(logging.ERROR if client.disk_failed or not client.failure else logging.INFO,
                                "follower of %s: %s (trying again every %.1f s)", leader.node_id, failure, pause)
                        said = failure
                    try:
                        await asyncio.wait_for(changed.wait(), pause)
                    except asyncio.TimeoutError:
                        pass
        finally:
            self.role = "starting"
            watcher.cancel()
            teller.cancel()
            announcer.cancel()
            client.stop()  # its thread's blocking read returns (a process cannot end while it waits)
            self.group.announce(None)
            lock.release()

    async def _announce_while_heard(self, client: ReplicaClient, leader: Member) -> None:
        """Announce the leader while this node hears its stream, and none while it does not (not reached yet, or
        lost): a leader out of this node's reach is likely out of its clients' too, which are told to come again,
        and try another node, rather than wait for a forward that may never answer."""
        announced: Member | None = None  # (nothing at first: what the board holds stands until this node hears)
        while True:
            heard = leader if client.heard_any and not client.lost_leader else None
            if heard is not announced:
                self.group.announce(heard)
                announced = heard
            await asyncio.sleep(REACH_POLL)

    async def _tell_how_it_follows(self, client: ReplicaClient, epoch: int) -> None:
        """Keep this node's member key saying whether it has lost the leader of ``epoch`` (heard nothing from it for
        the follower's silence limit), so that a leader left without copies can step aside for it, and whether its
        hot standby is whole, so that a node whose standby is not campaigns after one whose standby is."""
        told = (0, False)  # (lost_leader, standby) as this loop last registered them
        while True:
            await asyncio.sleep(self.config.cluster_ack_timeout / 2)
            lost = epoch if client.lost_leader else 0
            whole = self._standby_whole
            if (lost, whole) != told:
                try:
                    await self.coordinator.register(dataclasses.replace(self.member, lost_leader=lost, standby=whole))
                    newly_lost, told = lost and lost != told[0], (lost, whole)
                    if newly_lost:
                        log.warning("lost the leader of epoch %d: nothing heard from it for %.1f s", epoch,
                                    time.monotonic() - client.heard_at)
                except CoordinatorError:
                    pass


def can_lead(node: str, members: dict[str, Member], replicas: list[Replica] | None) -> bool:
    """Whether a node could win an election now: it is a member, and its data dir holds an in-sync copy (any does,
    in a cluster that never had a leader)."""
    member = members.get(node)
    return member is not None and (replicas is None or find_copy(replicas, node, member.dir) is not None)


