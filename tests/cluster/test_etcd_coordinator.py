"""The etcd coordinator on a real etcd (one member on loopback), under uvloop as Warren runs it: the contract every
coordinator keeps (tests/coordinator_contract.py, also run against the in-memory fake), then what only a real etcd
shows: leases that lapse by etcd's clock, an etcd that dies or hangs, and endpoints that do not answer."""

from __future__ import annotations

import asyncio
import time

import aetcd  # only to end a lease from outside, as its TTL passing would
import pytest
import uvloop

from cluster.coordinator import CoordinatorUnavailable, Leader
from cluster.etcd import EtcdCoordinator
from tests.conftest import free_port
from tests.coordinator_contract import CHECKS, Check, copies, member, won

PROMPT = 0.5  # seconds a failing call may take beyond its call_timeout


class EtcdNodes:
    """Coordinators of one cluster (one key prefix) on one etcd."""

    def __init__(self, endpoint: str, prefix: str, lease_ttl: float = 5.0):
        self.endpoint = endpoint
        self.prefix = prefix
        self.lease_ttl = lease_ttl
        self.started: list[EtcdCoordinator] = []

    async def start(self, node_id: str, lease_ttl: float | None = None) -> EtcdCoordinator:
        node = EtcdCoordinator([self.endpoint], self.prefix, node_id, lease_ttl or self.lease_ttl)
        await node.start()
        self.started.append(node)
        return node

    async def expire(self, node: EtcdCoordinator) -> None:
        host, port = self.endpoint.rsplit(":", 1)
        async with aetcd.Client(host=host, port=int(port), timeout=5) as client:
            await client.revoke_lease(node.lease_id)

    async def close(self) -> None:
        for node in self.started:
            await node.close()


def run(endpoint: str, prefix: str, scenario) -> None:
    async def with_nodes() -> None:
        nodes = EtcdNodes(endpoint, prefix)
        try:
            await scenario(nodes)
        finally:
            await nodes.close()

    uvloop.run(with_nodes())


async def fails_promptly(node: EtcdCoordinator, call) -> None:
    started = time.monotonic()
    with pytest.raises(CoordinatorUnavailable):
        await call
    assert time.monotonic() - started < node.call_timeout + PROMPT


async def every_call_fails_promptly(node: EtcdCoordinator, epoch: int) -> None:
    for call in (node.leader(), node.members(), node.isr(), node.set_isr(copies(node.node_id), epoch),
                 node.campaign(member(node.node_id)), node.register(member(node.node_id)), node.secret(),
                 node.resign()):
        await fails_promptly(node, call)
    started = time.monotonic()
    assert not await node.refresh()
    assert time.monotonic() - started < node.lease_ttl / 3 + PROMPT


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
def test_the_etcd_coordinator_keeps_the_contract(check: Check, etcd_endpoint, etcd_prefix) -> None:
    run(etcd_endpoint, etcd_prefix, check)


def test_a_lease_lapses_by_etcds_clock_without_keepalives(etcd_endpoint, etcd_prefix) -> None:
    async def scenario(nodes: EtcdNodes) -> None:
        a = await nodes.start("a", lease_ttl=2)
        granted = time.monotonic()
        b = await nodes.start("b")
        await a.register(member("a"))
        epoch = await won(a)
        await b.wait_leader_change(epoch, 10)
        assert 1.5 <= time.monotonic() - granted < 3.5  # etcd checks expiries every 0.5 s
        assert not a.lease_alive
        assert await b.members() == {}
        assert not await a.refresh()

    run(etcd_endpoint, etcd_prefix, scenario)


def test_keepalives_hold_a_lease_past_its_ttl(etcd_endpoint, etcd_prefix) -> None:
    async def scenario(nodes: EtcdNodes) -> None:
        a = await nodes.start("a", lease_ttl=2)
        epoch = await won(a)
        for _ in range(6):
            await asyncio.sleep(0.5)
            assert await a.refresh() and a.lease_alive
        assert await a.leader() == Leader(member("a"), epoch)

    run(etcd_endpoint, etcd_prefix, scenario)


def test_calls_fail_promptly_while_etcd_is_down_and_work_once_it_is_back(own_etcd, etcd_prefix) -> None:
    async def scenario(nodes: EtcdNodes) -> None:
        a = await nodes.start("a", lease_ttl=2)
        b = await nodes.start("b")
        epoch = await won(a)
        own_etcd.kill()
        await every_call_fails_promptly(a, epoch)
        started = time.monotonic()
        await b.wait_leader_change(epoch, 1)  # rides out the outage until its timeout
        assert 1 <= time.monotonic() - started < 1 + PROMPT
        await asyncio.sleep(2)
        assert not a.lease_alive  # no keepalive for a TTL: the lease can no longer be proven
        await asyncio.to_thread(own_etcd.restart)
        await answers_within(5, a)
        # etcd gives every lease a whole TTL anew when it comes back: a's lease and its leader key survive
        assert await a.leader() == Leader(member("a"), epoch)
        assert await a.refresh() and a.lease_alive
        assert await a.set_isr(copies("a"), epoch)

    run(own_etcd.endpoint, etcd_prefix, scenario)


async def answers_within(seconds: float, node: EtcdCoordinator) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            await node.isr()
            return
        except CoordinatorUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


def test_calls_time_out_while_etcd_hangs(own_etcd, etcd_prefix) -> None:
    async def scenario(nodes: EtcdNodes) -> None:
        a = await nodes.start("a", lease_ttl=2)
        epoch = await won(a)
        own_etcd.pause()
        try:
            await fails_promptly(a, a.leader())
            await fails_promptly(a, a.set_isr(copies("a"), epoch))
            started = time.monotonic()
            assert not await a.refresh()
            assert time.monotonic() - started < a.lease_ttl / 3 + PROMPT
        finally:
            own_etcd.resume()
        await answers_within(5, a)

    run(own_etcd.endpoint, etcd_prefix, scenario)


def test_start_fails_promptly_when_no_etcd_answers() -> None:
    async def scenario() -> None:
        node = EtcdCoordinator([f"127.0.0.1:{free_port()}"], "/warren/test", "a", lease_ttl=2)
        await fails_promptly(node, node.start())
        await node.close()

    uvloop.run(scenario())


def test_the_next_endpoint_is_tried_when_one_does_not_answer(etcd_endpoint, etcd_prefix) -> None:
    async def scenario() -> None:
        node = EtcdCoordinator([f"127.0.0.1:{free_port()}", etcd_endpoint], etcd_prefix, "a", lease_ttl=2)
        try:
            await node.start()
            assert await node.campaign(member("a")) is not None
        finally:
            await node.close()

    uvloop.run(scenario())


async def slow_to_answer(endpoint: str, delay: float) -> asyncio.Server:
    """A relay on loopback to etcd at endpoint that holds each new connection `delay` seconds before it passes
    anything on, as an etcd or a network slow to answer would (its port: server.sockets[0])."""
    host, port = endpoint.rsplit(":", 1)

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def relay(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(delay)
        etcd_reader, etcd_writer = await asyncio.open_connection(host, int(port))
        await asyncio.gather(pump(client_reader, etcd_writer), pump(etcd_reader, client_writer))

    return await asyncio.start_server(relay, "127.0.0.1", 0)


def test_a_connection_slow_to_set_up_is_waited_for_within_the_call_timeout(etcd_endpoint, etcd_prefix) -> None:
    """A busy machine can take more than a moment to set a connection up: a call waits for it as long as its
    call_timeout allows, not gRPC's own shorter connect deadline."""
    async def scenario() -> None:
        relay = await slow_to_answer(etcd_endpoint, 0.6)
        port = relay.sockets[0].getsockname()[1]
        node = EtcdCoordinator([f"127.0.0.1:{port}"], etcd_prefix, "a", lease_ttl=5)
        try:
            await node.start()
            assert await node.campaign(member("a")) is not None
        finally:
            await node.close()
            relay.close()

    uvloop.run(scenario())
