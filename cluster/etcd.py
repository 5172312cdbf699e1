"""The Coordinator on etcd's v3 API (kv, txn, lease, watch) through aetcd, an asyncio gRPC client.

This is the only module that knows the client library: swapping it (for etcd3gw, or a small client of etcd's
HTTP/JSON gateway) touches nothing else. Every request carries a deadline of call_timeout, and every way a request
can fail becomes CoordinatorUnavailable (or LeaseExpired), so an etcd that is down or stopped never hangs a caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from typing import Any, Awaitable, Callable, TypeVar

import aetcd
from aetcd import rpc, transactions

from cluster.coordinator import (
    CoordinatorError,
    CoordinatorUnavailable,
    Leader,
    LeaseExpired,
    LeaseHolder,
    Member,
    NodeStillNeeded,
    Replica,
    group_of,
    isr_from_json,
    isr_to_json,
    new_secret,
)

Result = TypeVar("Result")

# gRPC's reconnect backoff grows to 120 s by default: an etcd back after an outage would go unseen for minutes.
# Channels to one address share their connections through a process-wide pool unless told not to: a client made
# anew after a failure would then take up the same connection, stuck in TCP's retransmission back-off after a cut
# (a node cut from etcd for 30 s reached it again only 26 s after the cut healed). gRPC's "min_reconnect_backoff_ms"
# is in fact the deadline of one connection attempt (to etcd's SETTINGS frame): each client sets it to its
# call_timeout, as a busy machine can take more than 100 ms to set a connection up.
_CHANNEL_OPTIONS = {
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 500,
    "grpc.use_local_subchannel_pool": 1,
}
_WATCH_RETRY_DELAY = 0.2  # seconds between attempts to watch the leader key while etcd does not answer
_LEASE_NOT_FOUND = "requested lease not found"  # etcd's text when a key is to be bound to a lease that is gone


class _LeaseIs(transactions.BaseCompare):
    """A comparison of the lease a key is bound to (etcd's Compare.LEASE, which aetcd does not offer)."""

    def build_compare(self, compare: Any) -> None:
        compare.target = rpc.Compare.LEASE
        compare.lease = int(self.value)


class EtcdCoordinator(LeaseHolder):
    """A Coordinator on etcd. endpoints are etcd's client addresses as "host:port"; when the one in use stops
    answering, the next request goes to the next one."""

    def __init__(self, endpoints: list[str], prefix: str, node_id: str, lease_ttl: float, root: str | None = None):
        if not endpoints:
            raise ValueError("no etcd endpoint given")
        super().__init__(prefix, node_id, lease_ttl, root)
        self.endpoints = list(endpoints)
        self.call_timeout = lease_ttl / 3  # the longest any one request to etcd may take
        self._endpoint = 0  # index in endpoints of the one the client talks to
        self._client = self._new_client()
        self._closed = False  # close() closed the client: start() makes a new one

    async def start(self) -> None:
        """Grant the lease, trying each endpoint once, on a new client after close() or a failed start (a client
        whose connection attempts failed waits out gRPC's back-off before it tries again)."""
        if self._closed:
            self._client = self._new_client()
            self._closed = False
        for attempt in range(len(self.endpoints)):
            try:
                await self._grant()
                return
            except CoordinatorUnavailable:
                if attempt == len(self.endpoints) - 1:
                    self._closed = True
                    await self._quietly(self._client.close())
                    raise

    async def refresh(self) -> bool:
        sent_at = time.monotonic()
        try:
            reply = await self._call(lambda client: client.refresh_lease(self._lease_id))
        except CoordinatorUnavailable:
            return False
        if reply is None or reply.TTL <= 0:  # etcd answers a keepalive of an unknown lease with TTL 0
            self._proven_until = 0.0
            return False
        self._proven_until = sent_at + reply.TTL
        return True

    async def register(self, member: Member) -> None:
        key = self.keys.member(member.node_id).encode()
        await self._call(lambda client: client.put(key, member.to_json().encode(), lease=self._lease_id))
        known = self.keys.known_member(member.node_id).encode()
        await self._call(lambda client: client.put(known, member.to_json().encode()))

    async def members(self) -> dict[str, Member]:
        return await self._members_under(self.keys.members)

    async def known(self) -> dict[str, Member]:
        return await self._members_under(self.keys.known)

    async def _members_under(self, prefix: str) -> dict[str, Member]:
        found = await self._call(lambda client: client.get_prefix(prefix.encode()))
        return {kv.key.decode().removeprefix(prefix): Member.from_json(kv.value) for kv in found}

    async def campaign(self, leader: Member) -> int | None:
        key = self.keys.leader.encode()
        won, responses = await self._call(lambda client: client.transaction(
            compare=[client.transactions.create(key) == 0],
            success=[client.transactions.put(key, leader.to_json().encode(), lease=self._lease_id),
                     client.transactions.get(key)],
            failure=[],
        ))
        if not won:
            return None
        [(_, created)] = responses[1]
        return created.create_revision

    async def leader(self) -> Leader | None:
        found = await self._call(lambda client: client.get(self.keys.leader.encode()))
        return Leader(Member.from_json(found.value), found.create_revision) if found else None

    async def wait_leader_change(self, epoch: int | None, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                async with asyncio.timeout(remaining):
                    await self._watch_leader_until_not(epoch)
                return
            except TimeoutError:
                continue  # uvloop's timers may fire a millisecond early: the loop's condition decides
            except CoordinatorUnavailable:
                await asyncio.sleep(min(_WATCH_RETRY_DELAY, max(deadline - time.monotonic(), 0.0)))

    async def replicas(self) -> list[Replica] | None:
        found = await self._call(lambda client: client.get(self.keys.isr.encode()))
        return isr_from_json(found.value) if found else None

    async def set_isr(self, replicas: list[Replica], epoch: int) -> bool:
        return await self._write_isr(replicas, epoch, fenced=True)

    async def force_isr(self, replicas: list[Replica]) -> bool:
        return await self._write_isr(replicas, 0, fenced=False)

    async def secret(self) -> str:
        return await self._put_once(self.keys.secret, new_secret())

    async def preferred(self) -> str | None:
        found = await self._call(lambda client: client.get(self.keys.preferred.encode()))
        return found.value.decode() if found else None

    async def prefer(self, node: str | None) -> None:
        await self._set(self.keys.preferred, node)

    async def drained(self) -> set[str]:
        found = await self._call(lambda client: client.get_prefix(self.keys.maintenance.encode()))
        return {kv.key.decode().removeprefix(self.keys.maintenance) for kv in found}

    async def drain(self, node: str, on: bool) -> None:
        await self._set(self.keys.maintenance + node, "drained" if on else None)

    async def forget(self, node: str) -> None:
        if node in await self.members():
            raise NodeStillNeeded(f"node {node} is running")
        isr = self.keys.isr.encode()
        found = await self._call(lambda client: client.get(isr))
        if found and node in {replica.node for replica in isr_from_json(found.value)}:
            raise NodeStillNeeded(f"node {node} is in the in-sync replica set")
        member = self.keys.member(node).encode()
        forgotten, _ = await self._call(lambda client: client.transaction(
            compare=[client.transactions.create(member) == 0,  # not registered: its lease is gone
                     client.transactions.mod(isr) == (found.mod_revision if found else 0)],  # the ISR read
            success=[client.transactions.delete(self.keys.known_member(node).encode())],
            failure=[],
        ))
        if not forgotten:
            if node in await self.members():
                raise NodeStillNeeded(f"node {node} is running")
            raise CoordinatorError("the in-sync replica set changed meanwhile: try again")

    async def agree(self, name: str, proposal: str) -> str:
        return await self._put_once(self.keys.setting(name), proposal)

    async def record_vhost(self, vhost: str, group: int) -> int:
        key = self.keys.vhost(vhost)
        return group_of(key, await self._put_once(key, str(group)))

    async def forget_vhosts(self, vhosts: list[str]) -> None:
        for vhost in vhosts:
            await self._set(self.keys.vhost(vhost), None)

    async def vhost_groups(self, revision: int | None, timeout: float) -> tuple[dict[str, int], int]:
        prefix = self.keys.vhosts.encode()
        if revision is not None:
            watch = await self._call(lambda client: client.watch_prefix(prefix, start_revision=revision + 1))
            try:
                async with asyncio.timeout(timeout):
                    async for _ in watch:
                        break
            except TimeoutError:
                pass
            except aetcd.ClientError as error:
                raise CoordinatorUnavailable(f"the watch of {self.keys.vhosts} failed: {error}") from error
            finally:
                await self._quietly(watch.cancel())
        found = await self._call(lambda client: client.get_prefix(prefix))
        return ({item.key.decode()[len(self.keys.vhosts):]: group_of(item.key.decode(), item.value.decode())
                 for item in found}, found.header.revision)

    async def resign(self) -> None:
        key = self.keys.leader.encode()
        await self._call(lambda client: client.transaction(
            compare=[_LeaseIs(key) == self._lease_id],
            success=[client.transactions.delete(key)],
            failure=[],
        ))

    async def close(self) -> None:
        if self._lease_id:
            with contextlib.suppress(CoordinatorError):
                await self._call(lambda client: client.revoke_lease(self._lease_id))
        self._proven_until = 0.0
        self._closed = True
        await self._quietly(self._client.close())

    async def _grant(self) -> None:
        sent_at = time.monotonic()
        lease = await self._call(lambda client: client.lease(math.ceil(self.lease_ttl)))
        self._lease_id = lease.id
        self._proven_until = sent_at + lease.ttl  # etcd may grant more than asked (its minimum is 1.5 x election)

    async def _write_isr(self, replicas: list[Replica], epoch: int, fenced: bool) -> bool:
        """Write the ISR if the leader key is of ``epoch`` (0: none) and, when fenced, bound to this node's lease."""
        leader = self.keys.leader.encode()
        fence = [_LeaseIs(leader) == self._lease_id] if fenced else []
        written, _ = await self._call(lambda client: client.transaction(
            compare=[client.transactions.create(leader) == epoch, *fence],
            success=[client.transactions.put(self.keys.isr.encode(), isr_to_json(epoch, replicas).encode())],
            failure=[],
        ))
        return written

    async def _set(self, name: str, value: str | None) -> None:
        """Put ``value`` under the key ``name``, or delete the key when None."""
        if value is None:
            await self._call(lambda client: client.delete(name.encode()))
        else:
            await self._call(lambda client: client.put(name.encode(), value.encode()))

    async def _put_once(self, name: str, value: str) -> str:
        """What the key ``name`` holds: ``value``, unless a value was put there before."""
        key = name.encode()
        _, responses = await self._call(lambda client: client.transaction(
            compare=[client.transactions.create(key) == 0],
            success=[client.transactions.put(key, value.encode()), client.transactions.get(key)],
            failure=[client.transactions.get(key)],
        ))
        [(stored, _)] = responses[-1]
        return stored.decode()

    async def _watch_leader_until_not(self, epoch: int | None) -> None:
        """Return once the leader key's epoch is not epoch. The key is read first, and watched from the revision
        after that read, so no change between the two is missed."""
        key = self.keys.leader.encode()
        found = await self._call(lambda client: client.get_range(key, key + b"\0"))
        if (found[0].create_revision if found else None) != epoch:
            return
        watch = await self._call(lambda client: client.watch(key, start_revision=found.header.revision + 1))
        try:
            async for event in watch:
                if event.kind == aetcd.EventKind.DELETE or event.kv.create_revision != epoch:
                    return
        except aetcd.ClientError as error:
            raise CoordinatorUnavailable(f"the watch of {self.keys.leader} failed: {error}") from error
        finally:
            await self._quietly(watch.cancel())
        raise CoordinatorUnavailable(f"the watch of {self.keys.leader} ended")

    async def _call(self, request: Callable[[aetcd.Client], Awaitable[Result]]) -> Result:
        """Make one request of etcd within call_timeout; every way it can fail becomes a CoordinatorError."""
        client, endpoint = self._client, self.endpoints[self._endpoint]
        try:
            async with asyncio.timeout(self.call_timeout):
                return await request(client)
        except (aetcd.ClientError, rpc.BaseError, TimeoutError) as error:
            if _LEASE_NOT_FOUND in str(error):
                raise LeaseExpired(f"lease {self._lease_id:x} of {self.node_id} is gone") from error
            await self._next_endpoint(client)
            raise CoordinatorUnavailable(f"etcd at {endpoint}: {error!r}") from error
        except asyncio.CancelledError as error:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the caller is being cancelled, not the request
            raise CoordinatorUnavailable(f"etcd at {endpoint}: the client was closed") from error

    async def _next_endpoint(self, failed: aetcd.Client) -> None:
        """After a request on `failed` went unanswered, move on to the next endpoint (once, however many
        requests on it fail)."""
        if len(self.endpoints) == 1 or failed is not self._client:
            return
        self._endpoint = (self._endpoint + 1) % len(self.endpoints)
        self._client = self._new_client()
        await self._quietly(failed.close())

    def _new_client(self) -> aetcd.Client:
        host, port = self.endpoints[self._endpoint].rsplit(":", 1)
        options = {**_CHANNEL_OPTIONS, "grpc.min_reconnect_backoff_ms": math.ceil(self.call_timeout * 1000)}
        return aetcd.Client(host=host, port=int(port), timeout=self.call_timeout, options=options,
                            connect_wait_timeout=self.call_timeout)

    async def _quietly(self, step: Awaitable[Any]) -> None:
        """Wind something down within call_timeout, whatever happens (the client is being left anyway)."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.call_timeout):
                await step
