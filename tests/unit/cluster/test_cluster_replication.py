"""A leader's store streamed to followers in this process, with the in-memory coordinator: confirms wait for
min_insync copies and for every in-sync follower's ack; a follower's data dir ends byte-identical to the leader's;
an ISR shrink is committed to etcd before the confirms that no longer wait for the dropped follower; a follower
refuses frames of an older epoch; a deposed leader's ISR write is refused."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import logging
import re
import shutil
import socket
import threading
from pathlib import Path

import pytest
import uvloop

from broker.config import Config
from broker.connection.server import version
from broker.connection.tls import node_contexts
from cluster import frames
from cluster import follower as follower_module
from cluster.coordinator import Member
from cluster.follower import ReplicaClient
from cluster.replication import UNPROVEN_PER_ADDRESS, Follower, ReplicationServer
from cluster.state import read_epoch
from storage import digests as digests_module
from storage.digests import MARK, RunningDigests
from storage.format import CURRENT as STORE_FORMAT
from storage.replica import ReplicaWriter, replicated_files
from storage.store import MessageStore
from tests.unit.cluster.cluster_support import TIMEOUT, until
from tests.tls_certs import make_certificates
from tests.unit.cluster.fake_etcd import MemoryCoordinator, MemoryEtcd

SECRET = "cluster-secret"


def member(node: str) -> Member:
    return Member(node, "127.0.0.1", 5672, "127.0.0.1", 5680)


class Rig:
    """A leader (store + ReplicationServer) on etcd's fake, and followers that connect to it."""

    def __init__(self, root: Path, min_insync: int = 2, ack_timeout: float = 1.0) -> None:
        self.root = root
        self.tls: tuple | None = None  # (the leader's context, a follower's), for [cluster] tls
        self.etcd = MemoryEtcd()
        self.min_insync = min_insync
        self.ack_timeout = ack_timeout
        self.lost: list[str] = []
        self.followers: dict[str, tuple[ReplicaClient, asyncio.Task]] = {}
        self.next_id = 1

    async def lead(self) -> None:
        self.coordinator = MemoryCoordinator(self.etcd, "/w", "a", 5.0)
        await self.coordinator.start()
        self.epoch = await self.coordinator.campaign(member("a"))
        assert self.epoch is not None
        self.store = MessageStore(self.root / "a")
        self.server = ReplicationServer(self.store, self.coordinator, "a", "dir-a", self.epoch, SECRET,
                                        self.min_insync, self.ack_timeout, self.lost.append,
                                        RunningDigests(self.root / "a"))
        await self.server.start("127.0.0.1", 0, self.tls[0] if self.tls else None)
        self.store.recover()
        self.server.store_ready.set()

    def follow(self, node: str, secret: str = SECRET, epoch: int | None = None, tls=None) -> ReplicaClient:
        client = ReplicaClient(self.root / node, node, secret, self.ack_timeout,
                               tls or (self.tls[1] if self.tls else None))
        task = asyncio.ensure_future(client.follow("127.0.0.1", self.server.port, epoch or self.epoch))
        self.followers[node] = (client, task)
        return client

    async def follow_recorded(self, node: str) -> tuple[ReplicaClient, "Recorder"]:
        """A follower whose stream goes through a Recorder: what a listener on the link sees."""
        recorder = Recorder(self.server.port)
        port = await recorder.start()
        client = ReplicaClient(self.root / node, node, SECRET, self.ack_timeout, self.tls[1] if self.tls else None)
        self.followers[node] = (client, asyncio.ensure_future(client.follow("127.0.0.1", port, self.epoch)))
        return client, recorder

    async def stop_follower(self, node: str) -> None:
        client, task = self.followers.pop(node)
        client.stop()
        await asyncio.wait_for(task, TIMEOUT)

    def publish(self, count: int = 1, body: bytes = b"x" * 100) -> asyncio.Future:
        """Persistent messages to queue q; a future resolved with the batch outcome once confirmed."""
        for _ in range(count):
            self.store.append_message(self.next_id, ("/|q",), "", "q", b"", body)
            self.next_id += 1
        confirmed = asyncio.get_running_loop().create_future()
        self.store.when_durable(lambda ok: confirmed.done() or confirmed.set_result(ok))
        return confirmed

    async def isr(self) -> list[str] | None:
        return await self.coordinator.isr()

    async def wait_isr(self, wanted: list[str]) -> None:
        async def settled():
            while await self.isr() != wanted:
                await asyncio.sleep(0.01)
        await asyncio.wait_for(settled(), TIMEOUT)

    async def close(self) -> None:
        for node in list(self.followers):
            await self.stop_follower(node)
        await self.server.stop()
        self.store.close()


def same_files(leader: Path, follower: Path) -> None:
    names = replicated_files(leader)
    assert names == replicated_files(follower)
    for name in names:
        assert (leader / name).read_bytes() == (follower / name).read_bytes(), name


@pytest.fixture
def rig(tmp_path):
    return Rig(tmp_path)


async def not_within(future: asyncio.Future, seconds: float) -> bool:
    done, _ = await asyncio.wait({future}, timeout=seconds)
    return not done


def test_a_confirm_waits_for_min_insync_copies_and_the_follower_ends_identical(rig):
    async def main():
        await rig.lead()
        assert await rig.isr() == ["a"]
        first = rig.publish(10)
        assert await not_within(first, 0.3), "confirmed with one copy while min_insync is 2"
        rig.follow("b")
        await rig.wait_isr(["a", "b"])
        assert await asyncio.wait_for(first, TIMEOUT) is True
        later = rig.publish(50)
        assert await asyncio.wait_for(later, TIMEOUT) is True
        assert rig.server.status()["followers"]["b"]["acked"] >= 1
        await rig.close()
        same_files(rig.root / "a", rig.root / "b")
        assert read_epoch(rig.root / "b") == rig.epoch
    asyncio.run(main())


def test_a_dropped_follower_leaves_the_isr_in_etcd_before_confirms_go_on(rig):
    async def main():
        rig.min_insync = 2
        await rig.lead()
        rig.follow("b")
        rig.follow("c")
        await rig.wait_isr(["a", "b", "c"])
        await asyncio.wait_for(rig.publish(5), TIMEOUT)
        await rig.stop_follower("c")
        pending = rig.publish(5)
        ok = await asyncio.wait_for(pending, TIMEOUT)
        assert ok is True
        assert await rig.isr() == ["a", "b"], "the confirm went out before the shrink was committed"
        await rig.close()
    asyncio.run(main())


def test_a_follower_that_stops_acking_is_dropped_after_the_deadline(rig):
    # (the rig's ack_timeout, 1 s: a pause of the test process longer than ack_timeout drops followers that answer,
    # and the rig's never connect again; with 0.3 s, the suite's load once did so in the idle leader's test below)
    async def main():
        await rig.lead()
        client = rig.follow("b")
        muted = []  # once not empty, b applies frames but acks nothing
        acknowledge = client._acknowledge
        client._acknowledge = lambda stream, sequence: None if muted else acknowledge(stream, sequence)
        rig.follow("c")
        await rig.wait_isr(["a", "b", "c"])
        muted.append(True)
        started = asyncio.get_running_loop().time()
        assert await asyncio.wait_for(rig.publish(3), TIMEOUT) is True
        waited = asyncio.get_running_loop().time() - started
        assert rig.ack_timeout <= waited <= rig.ack_timeout + 1.0
        assert await rig.isr() == ["a", "c"]
        await rig.close()
    asyncio.run(main())


def test_a_follower_with_the_wrong_secret_is_refused(rig):
    async def main():
        await rig.lead()
        client = rig.follow("b", secret="guess")
        await asyncio.wait_for(rig.followers["b"][1], TIMEOUT)
        assert "its proof of the cluster's secret is wrong" in (client.failure or "")
        assert await rig.isr() == ["a"]
        rig.followers.pop("b")
        await rig.close()
    asyncio.run(main())


def test_a_follower_that_cannot_read_the_leaders_store_format_is_refused_saying_both_versions(rig, monkeypatch):
    """Rolling upgrades go followers first: a follower of an older Warren, whose store format is older than the one
    the leader writes, would hold files it cannot read; the leader refuses it, naming both."""
    monkeypatch.setattr(follower_module, "STORE_FORMAT", STORE_FORMAT - 1)

    async def main():
        await rig.lead()
        client = rig.follow("b")
        await asyncio.wait_for(rig.followers["b"][1], TIMEOUT)
        assert f"writes store format {STORE_FORMAT}; b runs Warren {version()} and reads store formats up to " \
               f"{STORE_FORMAT - 1}: upgrade the followers before the leader" in (client.failure or "")
        assert await rig.isr() == ["a"]
        rig.followers.pop("b")
        await rig.close()
    asyncio.run(main())


class Recorder:
    """A TCP relay between followers and the leader that keeps every byte it passes, each way: what a listener on
    the link between two nodes sees."""

    def __init__(self, port: int) -> None:
        self.port = port  # the leader's
        self.to_leader = bytearray()
        self.to_follower = bytearray()
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        leader_reader, leader_writer = await asyncio.open_connection("127.0.0.1", self.port)

        async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter, kept: bytearray) -> None:
            while data := await source.read(65536):
                kept += data
                sink.write(data)
            sink.close()
        await asyncio.gather(pump(reader, leader_writer, self.to_leader),
                             pump(leader_reader, writer, self.to_follower), return_exceptions=True)

    def close(self) -> None:
        assert self.server is not None
        self.server.close()


def test_the_secret_never_crosses_the_wire(rig):
    async def main():
        await rig.lead()
        client, recorder = await rig.follow_recorded("b")
        await rig.wait_isr(["a", "b"])
        assert await asyncio.wait_for(rig.publish(3), TIMEOUT) is True
        await rig.close()
        recorder.close()
        for kept in (recorder.to_leader, recorder.to_follower):
            assert SECRET.encode() not in kept
            assert SECRET.encode().hex().encode() not in kept
    asyncio.run(main())


def node_tls(certificates, certificate: str = "node") -> tuple:
    """node_contexts of a node whose certificate is certificate ("stranger-node": another CA signed it), which
    trusts the CA of certificates."""
    return node_contexts(Config(tls_certfile=certificates.path(f"{certificate}.pem"),
                                tls_keyfile=certificates.path(f"{certificate}.key"),
                                tls_cacertfile=certificates.path("ca.pem")))


def test_over_tls_the_stream_shows_nothing_of_what_it_carries(rig):
    async def main():
        rig.tls = node_tls(make_certificates(rig.root / "certs"))
        await rig.lead()
        client, recorder = await rig.follow_recorded("b")
        await rig.wait_isr(["a", "b"])
        assert await asyncio.wait_for(rig.publish(3, body=b"a message the network must not read"), TIMEOUT)
        await until(lambda: client.acked >= rig.server.status()["latest"], "b acked every frame")
        await rig.close()
        recorder.close()
        assert b"a message the network must not read" not in recorder.to_follower
        assert b'"node": "b"' not in recorder.to_leader  # (the hello, in clear without TLS)
        same_files(rig.root / "a", rig.root / "b")
    asyncio.run(main())


def test_over_tls_a_follower_whose_certificate_another_ca_signed_is_refused(rig, caplog):
    async def main():
        certificates = make_certificates(rig.root / "certs")
        rig.tls = node_tls(certificates)
        await rig.lead()
        stranger = rig.follow("b", tls=node_tls(certificates, "stranger-node")[1])
        await asyncio.wait_for(rig.followers["b"][1], TIMEOUT)
        # (TLS 1.3: the leader checks the follower's certificate once the follower's handshake is done)
        assert "the leader closed the connection before its challenge" in (stranger.failure or ""), stranger.failure
        assert "b" not in rig.server.status()["followers"]
        rig.followers.pop("b")
        await rig.close()
    asyncio.run(main())
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR or record.exc_info]


def test_a_handshake_seen_on_the_wire_and_sent_again_is_refused(rig):
    async def main():
        await rig.lead()
        client, recorder = await rig.follow_recorded("b")
        await rig.wait_isr(["a", "b"])
        await rig.stop_follower("b")
        await until(lambda: "b" not in rig.server.status()["followers"], "b dropped")
        reader, writer = await asyncio.open_connection("127.0.0.1", rig.server.port)
        writer.write(bytes(recorder.to_leader))  # b's hello, proof, manifest and acks, word for word
        answer = await asyncio.wait_for(reader.read(), TIMEOUT)
        kinds = [kind for kind, _ in frames.Reader(limit=frames.MAX_PAYLOAD).feed(answer)]
        assert kinds == [frames.CHALLENGE, frames.REFUSE]  # no copy, no frame
        assert "b" not in rig.server.status()["followers"]
        writer.close()
        recorder.close()
        await rig.close()
    asyncio.run(main())


def test_a_follower_of_one_group_takes_nothing_from_the_leader_of_another(rig):
    """(Groups of a node's workers, or clusters, that share one secret_file: a redirected follower.)"""
    async def main():
        await rig.lead()
        client = ReplicaClient(rig.root / "b", "b", SECRET, rig.ack_timeout, group="warren/1")
        rig.followers["b"] = (client, asyncio.ensure_future(client.follow("127.0.0.1", rig.server.port, rig.epoch)))
        await asyncio.wait_for(rig.followers["b"][1], TIMEOUT)
        assert "its proof of the cluster's secret is wrong" in (client.failure or "")
        assert not (rig.root / "b" / "messages").exists()
        rig.followers.pop("b")
        await rig.close()
    asyncio.run(main())


def test_a_leader_that_cannot_prove_the_secret_writes_nothing_to_a_follower(rig, tmp_path):
    async def main():
        await rig.lead()
        rig.publish(3)  # (confirmed by no follower: min_insync is 2)
        client = rig.follow("b", secret="the-real-secret")  # rig's leader was given another: an impostor to b
        await asyncio.wait_for(rig.followers["b"][1], TIMEOUT)
        assert "is refused: its proof of the cluster's secret is wrong" in (client.failure or "")
        assert not (rig.root / "b" / "messages").exists()
        rig.followers.pop("b")
        await rig.close()
    asyncio.run(main())


def test_a_follower_refuses_a_leader_of_an_older_epoch(rig):
    async def main():
        await rig.lead()
        rig.follow("b")
        await rig.wait_isr(["a", "b"])
        await rig.stop_follower("b")
        follower = ReplicaClient(rig.root / "b", "b", SECRET, rig.ack_timeout)
        await asyncio.wait_for(follower.follow("127.0.0.1", rig.server.port, rig.epoch - 1), TIMEOUT)
        assert "older" in (follower.failure or "")
        await rig.close()
    asyncio.run(main())


def test_a_deposed_leader_cannot_write_the_isr_and_confirms_nothing_more(rig):
    async def main():
        rig.min_insync = 1  # so that it tries to shrink the ISR to itself alone
        await rig.lead()
        rig.follow("b")
        await rig.wait_isr(["a", "b"])
        rig.etcd.expire_lease(rig.coordinator.lease_id)  # a pause longer than the lease: the key is gone
        other = MemoryCoordinator(rig.etcd, "/w", "b", 5.0)
        await other.start()
        assert await other.campaign(member("b")) is not None
        await rig.stop_follower("b")  # b leads now: the old leader must shrink its ISR to go on, and cannot
        stuck = rig.publish(1)
        assert await not_within(stuck, 0.5)
        assert rig.lost and "another node leads" in rig.lost[0]
        await rig.close()
    asyncio.run(main())



def test_a_follower_that_reconnects_while_the_leader_is_idle_gets_back_in_sync(rig):
    async def main():
        await rig.lead()
        client = rig.follow("b")
        await rig.wait_isr(["a", "b"])
        await rig.stop_follower("b")
        await until(lambda: "b" not in rig.server.status()["followers"], "b dropped")
        again = asyncio.ensure_future(client.follow("127.0.0.1", rig.server.port, rig.epoch))  # nothing written since
        rig.followers["b"] = (client, again)
        await rig.wait_isr(["a", "b"])
        assert await asyncio.wait_for(rig.publish(1), TIMEOUT) is True
        await rig.close()
    asyncio.run(main())


def hello(node: str = "b") -> bytes:
    return frames.encode(frames.HELLO, frames.hello_payload(node, f"dir-{node}", 0, bytes(16), "1.2.3", 3))


@pytest.mark.parametrize("hostile", [
    frames.encode(frames.HELLO, b"[" * 4000),  # nested beyond the JSON decoder's recursion limit
    hello() + frames.encode(frames.PROOF, bytes(32)),  # a guessed proof
    hello() + frames.encode(frames.PROOF, b"\xff" * 5000),  # a proof past the size taken before one is right
    hello("a") + frames.encode(frames.PROOF, bytes(32)),  # the leader's own node id, without the secret
    hello() + frames.encode_manifest([]),  # no proof at all
    frames.encode(frames.ACK, b"12345678"),  # no hello at all
    b"GET / HTTP/1.1\r\n\r\n",
])
def test_hostile_hellos_are_refused_quietly(rig, hostile, caplog):
    async def main():
        await rig.lead()
        reader, writer = await asyncio.open_connection("127.0.0.1", rig.server.port)
        writer.write(hostile)
        answer = await asyncio.wait_for(reader.read(), TIMEOUT)
        kinds = [kind for kind, _ in frames.Reader(limit=frames.MAX_PAYLOAD).feed(answer)]
        assert set(kinds) <= {frames.CHALLENGE, frames.REFUSE}
        writer.close()
        assert await rig.isr() == ["a"]
        assert not rig.lost
        await rig.close()
    asyncio.run(main())
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR or record.exc_info]


def test_connections_that_prove_nothing_are_bounded_per_address_and_a_follower_joins_once_they_go(rig, caplog):
    """A client that opens replication connections and proves nothing holds at most UNPROVEN_PER_ADDRESS of them:
    one more is closed before it is challenged. Once those close, a follower from that address is challenged and
    joins."""
    async def challenged(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(hello())
        try:
            head = await asyncio.wait_for(reader.readexactly(frames.HEADER.size), TIMEOUT)
        except (asyncio.IncompleteReadError, ConnectionResetError):  # closed (reset: the hello was not read)
            return False
        return frames.HEADER.unpack(head)[0] == frames.CHALLENGE

    async def main():
        await rig.lead()
        held = [await asyncio.open_connection("127.0.0.1", rig.server.port) for _ in range(UNPROVEN_PER_ADDRESS)]
        for reader, writer in held:  # each is being challenged: held open for its proof
            assert await challenged(reader, writer)
        reader, writer = await asyncio.open_connection("127.0.0.1", rig.server.port)
        assert not await challenged(reader, writer)  # closed without a word
        writer.close()
        for _, writer in held:
            writer.close()

        async def challenged_again() -> None:
            while True:
                reader, writer = await asyncio.open_connection("127.0.0.1", rig.server.port)
                admitted = await challenged(reader, writer)
                writer.close()
                if admitted:
                    return
        await asyncio.wait_for(challenged_again(), TIMEOUT)
        rig.follow("b")
        await rig.wait_isr(["a", "b"])
        await rig.close()
    asyncio.run(main())
    assert [record.getMessage() for record in caplog.records if "too many connections" in record.getMessage()]


def test_below_min_insync_the_isr_keeps_the_replicas_that_hold_every_confirm(rig):
    async def main():
        await rig.lead()
        rig.follow("b")
        rig.follow("c")
        await rig.wait_isr(["a", "b", "c"])
        await rig.stop_follower("c")
        assert await asyncio.wait_for(rig.publish(5), TIMEOUT) is True  # a and b still make min_insync
        assert await rig.isr() == ["a", "b"]
        await rig.stop_follower("b")
        stuck = rig.publish(5)
        assert await not_within(stuck, 3 * rig.ack_timeout), "confirmed with one copy while min_insync is 2"
        assert await rig.isr() == ["a", "b"], "b holds every confirm: it stays electable"
        rig.follow("b")  # back: its copy is rewritten, so it leaves the ISR first, then enters it again
        assert await asyncio.wait_for(stuck, TIMEOUT) is True
        assert await rig.isr() == ["a", "b"]
        await rig.close()
        same_files(rig.root / "a", rig.root / "b")
    asyncio.run(main())


def test_a_node_back_with_another_data_dir_is_a_new_follower(rig):
    async def main():
        await rig.lead()
        rig.follow("b")
        await rig.wait_isr(["a", "b"])
        await rig.stop_follower("b")
        before = {replica.node: replica.dir for replica in await rig.coordinator.replicas()}
        shutil.rmtree(rig.root / "b")  # a wiped disk: same node id, new data dir identity
        rig.follow("b")
        await until(lambda: rig.server.status()["followers"].get("b", {}).get("in_sync"), "b caught up")
        await rig.wait_isr(["a", "b"])
        after = {replica.node: replica.dir for replica in await rig.coordinator.replicas()}
        assert after["b"] != before["b"]
        assert await asyncio.wait_for(rig.publish(1), TIMEOUT) is True
        await rig.close()
        same_files(rig.root / "a", rig.root / "b")
    asyncio.run(main())


@pytest.mark.parametrize("b_says_it_lost_the_leader", [True, False])
def test_a_leader_below_min_insync_steps_aside_for_a_replica_that_lost_it(rig, b_says_it_lost_the_leader):
    async def main():
        rig.ack_timeout = 0.3
        await rig.lead()
        rig.follow("b")
        await rig.wait_isr(["a", "b"])
        await rig.stop_follower("b")
        b = MemoryCoordinator(rig.etcd, "/w", "b", 5.0)  # b, cut off from a, still reaches etcd
        await b.start()
        await b.register(dataclasses.replace(member("b"), lost_leader=rig.epoch if b_says_it_lost_the_leader else 0))
        if b_says_it_lost_the_leader:
            await until(lambda: rig.lost, "leadership given up")
            assert "stepping aside" in rig.lost[0] and rig.server.stepped_aside
        else:  # b may be dead: a keeps leading, waiting for a copy
            await asyncio.sleep(6 * rig.ack_timeout)  # nothing may happen: no event to wait for
            assert rig.lost == [] and not rig.server.stepped_aside
        await rig.close()
    asyncio.run(main())


def test_an_idle_leader_keeps_its_followers_and_drops_one_that_answers_no_heartbeat(rig):
    # (the rig's ack_timeout, 1 s: as above)
    async def main():
        await rig.lead()
        rig.follow("b")
        deaf = rig.follow("c")
        await rig.wait_isr(["a", "b", "c"])
        answered = []  # once not empty, c still acks frames but answers no heartbeat
        send_heartbeat = deaf._answer_heartbeat
        deaf._answer_heartbeat = lambda stream: None if answered else send_heartbeat(stream)
        await asyncio.sleep(3 * rig.ack_timeout)  # idle: heartbeats alone keep b and c in
        assert await rig.isr() == ["a", "b", "c"]
        answered.append(True)
        await rig.wait_isr(["a", "b"])
        assert await asyncio.wait_for(rig.publish(1), TIMEOUT) is True
        await rig.close()
    asyncio.run(main())


def test_a_follower_leaves_a_leader_that_says_nothing(tmp_path):
    async def main():
        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read()  # the hello, then nothing: a leader behind a cut link
        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        client = ReplicaClient(tmp_path / "b", "b", SECRET, 0.3)
        started = asyncio.get_running_loop().time()
        await asyncio.wait_for(client.follow("127.0.0.1", server.sockets[0].getsockname()[1], 1), TIMEOUT)
        assert "no word from the leader" in (client.failure or "")
        assert 0.6 <= asyncio.get_running_loop().time() - started < 2.0
        assert client.lost_leader
        server.close()
    asyncio.run(main())


def copy_logged(caplog, node: str) -> tuple[int, int]:
    """(bytes sent, bytes it held already) of the latest copy the leader logged for ``node``."""
    [*_, line] = [record.getMessage() for record in caplog.records if f"follower {node} got a copy" in record.getMessage()]
    sent, held = re.search(r"\((\d+) bytes sent, (\d+) it held already\)", line).groups()
    return int(sent), int(held)


def test_a_follower_back_gets_only_what_its_files_lack_and_a_diverged_file_whole(rig, caplog):
    caplog.set_level(logging.INFO, logger="cluster.replication")

    async def main():
        await rig.lead()
        rig.follow("b")
        await rig.wait_isr(["a", "b"])
        assert await asyncio.wait_for(rig.publish(2000, b"x" * 1000), TIMEOUT) is True
        await rig.stop_follower("b")
        rig.follow("b")  # nothing written meanwhile: it holds everything
        await until(lambda: rig.server.status()["followers"].get("b", {}).get("in_sync"), "b back in sync")
        sent, held = copy_logged(caplog, "b")
        assert held >= 2_000_000 and sent < 1000, (sent, held)
        await rig.stop_follower("b")
        [segment] = [path for path in (rig.root / "b" / "messages").iterdir() if path.stat().st_size > 1_000_000]
        damaged = bytearray(segment.read_bytes())
        damaged[len(damaged) // 2] ^= 1  # a diverged history (or a flipped bit): its digest no longer matches
        segment.write_bytes(damaged)
        rig.follow("b")
        await until(lambda: rig.server.status()["followers"].get("b", {}).get("in_sync"), "b back in sync again")
        sent, _ = copy_logged(caplog, "b")
        assert sent >= len(damaged)
        assert await asyncio.wait_for(rig.publish(10), TIMEOUT) is True
        await rig.close()
        same_files(rig.root / "a", rig.root / "b")
    asyncio.run(main())


def test_a_follower_back_on_the_same_node_hashes_nothing_it_wrote_and_the_leader_a_megabyte_a_file(
        rig, caplog, monkeypatch):
    """What each side wrote while it followed or led has its digest already: a rejoin (after a failover, say) costs
    no pass over the files."""
    caplog.set_level(logging.INFO, logger="cluster.replication")
    hashed: list[int] = []  # bytes read from disk to hash them
    hash_from = digests_module._hash_from
    monkeypatch.setattr(digests_module, "_hash_from", lambda digest, fd, offset, size, marks=None: (
        hashed.append(size - offset) or hash_from(digest, fd, offset, size, marks)))

    async def main():
        await rig.lead()
        client = rig.follow("b")
        await rig.wait_isr(["a", "b"])
        assert await asyncio.wait_for(rig.publish(6000, b"x" * 1000), TIMEOUT) is True
        await rig.stop_follower("b")
        hashed.clear()
        rig.followers["b"] = (client, asyncio.ensure_future(client.follow("127.0.0.1", rig.server.port, rig.epoch)))
        await until(lambda: rig.server.status()["followers"].get("b", {}).get("in_sync"), "b back in sync")
        sent, held = copy_logged(caplog, "b")
        assert held >= 6_000_000 and sent < 1000, (sent, held)
        assert sum(hashed) < MARK + 10_000, hashed  # the segment's bytes since its last mark, and files never written
        assert await asyncio.wait_for(rig.publish(10), TIMEOUT) is True
        await rig.close()
        same_files(rig.root / "a", rig.root / "b")
    asyncio.run(main())


def test_a_follower_whose_disk_fills_leaves_the_isr_and_confirms_go_on(rig, monkeypatch):
    async def main():
        await rig.lead()
        rig.follow("b")
        rig.follow("c")
        await rig.wait_isr(["a", "b", "c"])
        write_all = ReplicaWriter._write_all
        b_data = rig.root / "b"

        def full_on_b(writer: ReplicaWriter, fd: int, data: bytes) -> None:
            if writer._data_dir == b_data:
                raise OSError(errno.ENOSPC, "No space left on device")
            write_all(writer, fd, data)
        monkeypatch.setattr(ReplicaWriter, "_write_all", full_on_b)
        assert await asyncio.wait_for(rig.publish(5), TIMEOUT) is True
        assert await rig.isr() == ["a", "c"]
        client, task = rig.followers["b"]
        await asyncio.wait_for(task, TIMEOUT)
        assert client.disk_failed and "cannot take the leader's writes" in client.failure
        assert "No space left on device" in client.failure
        rig.followers.pop("b")
        await rig.close()
    asyncio.run(main())


def test_a_follower_stopped_while_it_connects_ends_once_connected(tmp_path, monkeypatch):
    """stop() finds no socket to shut down yet: the stream must end as soon as it has one, not wait for the
    leader's silence (a node that stops would wait on that thread, and not exit)."""
    hashing = threading.Event()
    stopped = threading.Event()

    def slow_digests(data_dir, running=None):
        hashing.set()
        stopped.wait(TIMEOUT)
        return []
    monkeypatch.setattr(follower_module, "file_digests", slow_digests)

    async def main():
        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read()
        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        client = ReplicaClient(tmp_path / "b", "b", SECRET, 30.0)  # a silence of 60 s: only stop() can end it
        following = asyncio.ensure_future(client.follow("127.0.0.1", server.sockets[0].getsockname()[1], 1))
        await asyncio.get_running_loop().run_in_executor(None, hashing.wait, TIMEOUT)
        client.stop()
        stopped.set()
        await asyncio.wait_for(following, 5.0)
        server.close()
    asyncio.run(main())


def test_a_frame_for_a_follower_whose_connection_closed_is_not_written_and_the_copy_ends_on_its_drain():
    """A leader stepping down during a join closes the follower's connection while its copy is being sent: the
    copy's next write must not raise from the transport (a task's exception nobody reads), its drain says why."""
    async def main():
        leader_end, follower_end = socket.socketpair()
        _, writer = await asyncio.open_connection(sock=leader_end)
        follower = Follower("b", "its-dir", {}, 1, writer)
        follower.close()
        await writer.wait_closed()  # (the transport's handle closed: a write to it would raise)
        follower.write(b"a frame")
        with pytest.raises(ConnectionError):
            await asyncio.wait_for(writer.drain(), TIMEOUT)
        follower_end.close()
    uvloop.run(main())
