"""One node of a cluster: follow the leader, or campaign and lead, as etcd decides.

A node grants itself an etcd lease and registers under ``members/``. While a leader is known it follows it: its data
dir receives the leader's writes (``ReplicaClient``) and its AMQP port forwards clients to the leader
(``AmqpForwarder``). When the leader key is gone, a node in the ISR (or any node of a fresh cluster) campaigns; the
winner checks it is still in the ISR, then promotes: today's recovery on its replicated data dir, then the broker
serves, ``ReplicationServer`` streaming to followers and gating confirms on them.

A leader renews its lease only while the store's writer makes progress (a stuck disk lets the lease lapse), and
stops serving as soon as it cannot prove its lease is alive (``lease_ttl`` after the last renewal etcd confirmed),
or etcd shows another leader. It then becomes a follower again, which rewrites its data dir from the new leader.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from broker.config import Config
from broker.connection.server import Server, StartupError
from broker.management.server import start_management, start_prometheus
from cluster.coordinator import Coordinator, CoordinatorError, CoordinatorUnavailable, Member
from cluster.proxy import AmqpForwarder
from cluster.replication import LeadershipLost, ReplicaClient, ReplicationServer, write_epoch
from storage.lock import DataDirLock, DataDirLocked

log = logging.getLogger("cluster")

RETRY = 0.2  # seconds between attempts while etcd or the leader cannot be reached
PROGRESS_PROBE = "the store's writer has finished no batch for {:.1f} s: the lease is not renewed"
UNHEALTHY = "the store's writes fail: the lease is not renewed, so that a node with a working disk takes over"


def make_coordinator(config: Config) -> Coordinator:
    from cluster.etcd import EtcdCoordinator  # only a clustered node needs etcd's client

    return EtcdCoordinator(config.cluster_etcd_endpoints, f"/warren/{config.cluster_name}", config.cluster_node_id,
                           config.cluster_lease_ttl)


class ClusterNode:
    def __init__(self, config: Config, coordinator: Coordinator) -> None:
        self.config = config
        self.node = config.cluster_node_id
        self.data_dir = Path(config.data_dir)
        self.coordinator = coordinator
        self.ttl = config.cluster_lease_ttl
        self.member = Member(self.node, self._advertised(), config.port, self._advertised(),
                             config.cluster_replication_port)
        self.secret = ""  # the cluster's shared secret (from etcd)
        self.role = "starting"  # starting, follower, leader
        self.server: Server | None = None  # the broker, while leading
        self._proven_until = 0.0  # monotonic time until which the lease is known to be alive
        self._proof_timer: asyncio.TimerHandle | None = None  # ends leadership the moment the proof runs out
        self._lost: asyncio.Future[str] | None = None  # resolved with a reason when leadership must end
        self._stopping = False

    def _advertised(self) -> str:
        return self.config.cluster_advertise_host or self.config.host

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
        await self.coordinator.close()
        error = life.exception() if life.done() and not life.cancelled() else None
        if error is not None:
            raise error  # the process exits with the error, so that a supervisor restarts it

    async def _live(self) -> None:
        await self._join_cluster()
        keeper = asyncio.ensure_future(self._keep_lease())
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

    async def _join_cluster(self) -> None:
        """Grant a lease, learn the secret, register; retrying until etcd answers."""
        while True:
            try:
                asked = time.monotonic()
                await self.coordinator.start()
                self._renewed(asked)
                self.secret = await self.coordinator.secret()
                await self.coordinator.register(self.member)
                return
            except CoordinatorError as error:
                log.warning("cannot join the cluster through etcd yet: %s", error)
                await asyncio.sleep(RETRY * 5)

    async def _step(self) -> None:
        current = await self.coordinator.leader()
        if current is None:
            isr = await self.coordinator.isr()
            if isr is None or self.node in isr:
                epoch = await self.coordinator.campaign(self.member)
                if epoch is not None:
                    await self._lead_or_resign(epoch)
                    return
            await self.coordinator.wait_leader_change(None, self.ttl)
            return
        leader, epoch = current
        if leader.node_id == self.node:  # won, but the answer was lost; or a key left by this node's previous run
            await self.coordinator.resign()  # deletes it only if bound to this run's lease
            await self.coordinator.wait_leader_change(epoch, self.ttl)
            return
        await self._follow(leader, epoch)

    # --- leading --------------------------------------------------------------------------------------------
    async def _lead_or_resign(self, epoch: int) -> None:
        isr = await self.coordinator.isr()
        if isr is not None and self.node not in isr:  # dropped from the ISR while campaigning: not electable
            log.warning("won the election but is not in the ISR %s: resigning", isr)
            await self.coordinator.resign()
            return
        try:
            reason = await self._lead(epoch)
        except Exception as error:  # say a data dir that cannot be recovered: another node may do better
            log.error("cannot lead: %s", error, exc_info=not isinstance(error, (OSError, StartupError)))
            reason = f"it could not start: {error}"
            await asyncio.sleep(RETRY * 5)
        log.warning("stopped leading (epoch %d): %s", epoch, reason)
        await self.coordinator.close()  # the lease goes, and the leader key with it (or it lapses by itself)
        if not self._stopping:
            await self._join_cluster()

    async def _lead(self, epoch: int) -> str:
        """Serve as the leader of ``epoch`` until leadership must end; returns why."""
        log.info("leading the cluster (epoch %d)", epoch)
        self.role = "leader"
        self._lost = asyncio.get_running_loop().create_future()
        await asyncio.get_running_loop().run_in_executor(None, write_epoch, self.data_dir, epoch)
        server = Server(self.config)
        replication = ReplicationServer(server.store, self.coordinator, self.node, epoch, self.secret,
                                        self.config.cluster_min_insync, self.config.cluster_ack_timeout,
                                        self._lose)
        listeners = []
        watcher = None
        try:
            await replication.start(self.config.host, self.config.cluster_replication_port)
            await server.start()
            self.server = server
            replication.store_ready.set()
            if self.config.management_port:
                listeners.append(await start_management(server))
            if self.config.prometheus_port:
                listeners.append(await start_prometheus(server))
            watcher = asyncio.ensure_future(self._watch_leadership(epoch, server))
            return await self._lost
        except LeadershipLost as error:
            return str(error)
        finally:
            replication.halt()  # not one confirm more
            self.role = "starting"
            self.server = None
            if watcher is not None:
                watcher.cancel()
            await server.stop(grace=0)
            await replication.stop()
            for listener in listeners:
                await listener.stop()

    def _lose(self, reason: str) -> None:
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(reason)

    async def _watch_leadership(self, epoch: int, server: Server) -> None:
        """Leadership ends when etcd shows another leader; members' addresses may send PROXY headers."""
        while True:
            try:
                current = await self.coordinator.leader()
                if current is None or current[1] != epoch:
                    self._lose("etcd shows another leader")
                    return
                members = await self.coordinator.members()
                server.trusted_proxies = frozenset(member.amqp_host for member in members.values())
                await self.coordinator.wait_leader_change(epoch, self.ttl / 2)
            except CoordinatorError:
                await asyncio.sleep(RETRY)

    # --- the lease ------------------------------------------------------------------------------------------
    async def _keep_lease(self) -> None:
        """Renew every third of the TTL (a leader only while its disk makes progress); a leader that cannot prove
        its lease alive stops leading."""
        while True:
            await asyncio.sleep(self.ttl / 3)
            self._check_proof()  # first of all after a pause (SIGSTOP, a frozen VM): the lease may be gone
            server = self.server
            if server is not None:
                server.store.when_durable(_ignore)  # an idle store still proves its writer turns over
                stalled = time.monotonic() - server.store.writer_progress()
                if stalled > self.ttl / 2 or not server.store.healthy:
                    log.error(PROGRESS_PROBE.format(stalled) if server.store.healthy else UNHEALTHY)
                    self._check_proof()
                    continue
            asked = time.monotonic()
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
        forwarder = AmqpForwarder(lambda: (leader.amqp_host, leader.amqp_port))
        client = ReplicaClient(self.data_dir, self.node, self.secret)
        changed = asyncio.Event()
        watcher = asyncio.ensure_future(self._watch_leader(epoch, changed))
        try:
            await forwarder.start(self.config.host, self.config.port)
            while not changed.is_set():
                stream = asyncio.ensure_future(client.follow(leader.replication_host, leader.replication_port, epoch))
                waiter = asyncio.ensure_future(changed.wait())
                await asyncio.wait({stream, waiter}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                if not stream.done():
                    client.stop()
                    await stream
                elif client.failure:
                    log.info("follower of %s: %s", leader.node_id, client.failure)
                    try:
                        await asyncio.wait_for(changed.wait(), RETRY)
                    except asyncio.TimeoutError:
                        pass
        finally:
            self.role = "starting"
            watcher.cancel()
            client.stop()  # its thread's blocking read returns (a process cannot end while it waits)
            await forwarder.stop()
            lock.release()

    async def _watch_leader(self, epoch: int, changed: asyncio.Event) -> None:
        while True:
            try:
                current = await self.coordinator.leader()
                if current is None or current[1] != epoch:
                    changed.set()
                    return
                await self.coordinator.wait_leader_change(epoch, self.ttl)
            except CoordinatorError:
                await asyncio.sleep(RETRY)


def _ignore(ok: bool) -> None:
    pass
