"""Shipping the leader's store writes to followers, and holding confirms until the in-sync replicas have them.

Leader side (``ReplicationServer``): the store's writer thread hands each batch's file operations to ``_tap``
before its own fdatasync; they are framed once and written to every follower's socket on the loop. A confirm (any
``store.when_durable`` callback) is released by ``_gate`` only once the leader's own fsync is done (the store calls
the gate after it), every replica of the in-sync replica set (ISR) *as last committed to etcd* has acked the batch,
and the ISR has at least ``min_insync`` replicas. A replica is a node's data dir, named by its identity
(``cluster.state``): a node back with a new data dir is a new follower, not the replica the ISR names.

A follower that leaves, leaves frames unacked for ``ack_timeout`` or goes silent that long (the leader sends a
heartbeat whenever it has sent nothing for a quarter of it, and the follower answers each) is dropped, and the ISR
changes as cluster.isr decides.

A joining follower gets a copy of the data dir as of a cut the writer thread takes between two batches, then every
frame after the cut; it leaves the ISR before its copy starts and enters it once it has acked all frames sent up to
the end of its copy. The copy sends only what the follower lacks: a file it showed it holds (its manifest: size and
SHA-256) as a prefix of the leader's is kept and only its tail sent, everything else goes and is sent whole, so a
follower that was in sync with a failed leader catches up with its successor without the files being sent again.
Neither side hashes what it wrote while it followed or led (``storage.digests``): a join after a failover costs
about a megabyte read per file. One join runs at a time.

The follower's end of the stream is cluster.follower.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time
from collections import Counter, deque
from collections.abc import Callable

from broker.connection.peer_log import PeerLog
from broker.connection.server import version
from cluster import frames
from cluster.coordinator import Coordinator, Replica
from cluster.isr import InSyncReplicas
from protocol import node_proof
from storage.format import CURRENT as STORE_FORMAT
from storage.digests import RunningDigests, RunningFile, prefix_digest
from storage.replica import APPEND, ReplicaError, encode_ops, ops_parts, reset_op

log = logging.getLogger("cluster.replication")
peer_log = PeerLog(log)  # refused connections, a few lines a second per address at most

COPY_CHUNK = 1 << 20  # bytes of a file sent per frame of a join's copy
CUT_TIMEOUT = 30.0  # seconds the writer may take to hand over a cut (it comes with the next batch)
STALLED_COPY = 10.0  # seconds a joining follower may go without reading any of its copy
END_OF_COPY = encode_ops([])  # the ops of the frame that closes a join's copy (it carries the cut's sequence)
ACK_LIMIT = 1000  # bytes of the largest message a follower sends once it streams (acks and heartbeats)
# Connections still proving the cluster's secret, at once, from one address (a node's follower needs one) and from
# all: one past either is closed at once, so that a flood holds a bounded number of sockets and tasks, whatever it
# sends, and leaves the node's descriptors to its clients
UNPROVEN_PER_ADDRESS = 8
UNPROVEN_MAX = 256


class Follower:
    """The leader's view of one follower connection."""

    def __init__(self, node: str, dir: str, holds: dict[str, tuple[int, str]], epoch: int,
                 writer: asyncio.StreamWriter) -> None:
        self.node = node
        self.dir = dir  # the identity of its data dir
        self.holds = holds  # the files it holds as it connected: path -> (size, sha256 hex), from its manifest
        self.epoch = epoch  # the leader's epoch, whose frames it acks
        self.writer = writer
        self.cut: int | None = None  # the sequence its copy stands at, once the writer took the cut
        self.followed: dict[str, RunningFile] = {}  # the cut's files whose digests were kept: path -> its digests
        # (sequence, frame) after the cut, held while the copy is sent
        self.buffered: list[tuple[int, frames.Parts]] = []
        self.streaming = False  # the copy is sent: frames go straight to the socket
        self.target = -1  # the sequence to ack before it may enter the ISR
        self.in_sync = False  # caught up: the leader wants it in the ISR
        self.acked = -1  # the highest sequence it has made durable
        self.sent = -1  # the highest sequence written to its socket
        self.unacked: deque[tuple[int, float]] = deque()  # (sequence, monotonic time sent) of frames not acked yet
        self.written_at = time.monotonic()  # when anything was last written to its socket
        self.heard_at = time.monotonic()  # when anything last came from it
        self.closed = False

    def send(self, sequence: int, frame: frames.Parts) -> None:
        if sequence > self.acked:
            self.unacked.append((sequence, time.monotonic()))
        self.sent = max(self.sent, sequence)
        self.write(frame)

    def write(self, parts: frames.Parts) -> None:
        """Send these bytes, unless its connection is closed already (the leader stepped down during a join, say):
        the next drain then says the connection is lost, where a write would raise from the transport."""
        if self.writer.is_closing():
            return
        self.written_at = time.monotonic()
        self.writer.writelines(parts)

    def acknowledged(self, sequence: int) -> None:
        self.acked = sequence
        unacked = self.unacked
        while unacked and unacked[0][0] <= sequence:
            unacked.popleft()

    def close(self) -> None:
        self.closed = True
        self.writer.close()


class ReplicationServer:
    """The leader's end: accepts followers, streams the store's writes to them, gates confirms on their acks."""

    def __init__(self, store, coordinator: Coordinator, node: str, dir: str, epoch: int, secret: str,
                 min_insync: int, ack_timeout: float, lost: Callable[[str], None], digests: RunningDigests,
                 group: str = "") -> None:
        self._store = store  # storage.store.MessageStore of the leader, not yet recovered
        self._digests = digests  # of its files, followed through the writer's frames (the node's, kept as it followed)
        self._node = node
        self._dir = dir  # the identity of this leader's data dir
        self._epoch = epoch
        self._key = frames.link_key(secret, group)  # what both sides prove the cluster's secret with
        self._ack_timeout = ack_timeout
        self._lost = lost  # called once if etcd says another node leads now
        self._loop = asyncio.get_running_loop()
        self._followers: dict[str, Follower] = {}
        self._isr = InSyncReplicas(coordinator, node, epoch, min_insync, self._live, lambda: self._followers,
                                   self._release_ready, lost)
        self._held: deque[tuple[int, Callable[[], None]]] = deque()  # (batch sequence, release) not confirmed yet
        self._latest = 0  # the highest sequence the writer has tapped
        self._released = -1  # the highest sequence whose confirms went out
        self._join_lock = asyncio.Lock()  # one join at a time
        self.store_ready = asyncio.Event()  # set once the store is recovered: cuts can be taken
        self._listener: asyncio.base_events.Server | None = None
        self._tasks: list[asyncio.Task] = []
        self._connections: set[asyncio.Task] = set()  # each follower connection's task
        self._unproven: Counter[str] = Counter()  # address -> its connections that have not proven the secret yet
        self._stopped = False

    # --- lifecycle ------------------------------------------------------------------------------------------
    async def start(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> None:
        """Listen for followers (over TLS with tls: [cluster] tls) and commit the first ISR of this epoch (the
        previous one's replicas, as long as they are needed to make min_insync); call before the store recovers."""
        self._store.replicate(self._tap, self._gate)
        self._listener = await asyncio.start_server(self._serve_follower, host, port, reuse_address=True, ssl=tls,
                                                    ssl_handshake_timeout=self._ack_timeout * 5 if tls else None)
        if not await self._isr.start():
            raise LeadershipLost("etcd refused this node's ISR: another node leads")
        self._tasks = [asyncio.ensure_future(task) for task in (
            self._isr.keep(), self._keep_followers(), self._isr.step_aside_when_outnumbered(self._ack_timeout / 2))]
        for task in self._tasks:
            task.add_done_callback(self._task_ended)

    def _task_ended(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.critical("replication task failed: leadership ends", exc_info=task.exception())
            self._lost(f"replication task failed: {task.exception()!r}")

    @property
    def stepped_aside(self) -> bool:
        """Leadership ended for want of min_insync copies, in favour of a replica (cluster.isr)."""
        return self._isr.stepped_aside

    @property
    def port(self) -> int:
        assert self._listener is not None, "start() first"
        return self._listener.sockets[0].getsockname()[1]

    def halt(self) -> None:
        """Release no confirm from now on (leadership is ending)."""
        self._stopped = True
        self._held.clear()

    async def stop(self) -> None:
        """Confirm nothing more, drop every follower, stop listening."""
        self.halt()
        for task in self._tasks:
            task.cancel()
        for follower in list(self._followers.values()):
            follower.close()
        self._followers.clear()
        if self._listener is not None:
            self._listener.close()
        if self._connections:  # they end as their sockets close
            await asyncio.wait(self._connections, timeout=1)
        if self._listener is not None:
            await self._listener.wait_closed()

    def status(self) -> dict:
        """For logs and the management API: the committed ISR and each follower's progress."""
        return {"epoch": self._epoch, "isr": [replica.node for replica in self._isr.committed], "latest": self._latest,
                "followers": {node: {"acked": f.acked, "in_sync": f.in_sync, "copying": not f.streaming}
                              for node, f in self._followers.items()}}

    # --- the writer thread's frames -------------------------------------------------------------------------
    def _tap(self, sequence: int, ops: list) -> None:
        """On the writer thread, before its fdatasync: one frame per call, sent on the loop."""
        frame = frames.frame_parts(self._epoch, sequence, ops_parts(ops))
        try:
            self._loop.call_soon_threadsafe(self._broadcast, sequence, frame)
        except RuntimeError:  # the loop is closed: nobody is left to send to
            pass
        self._digests.follow(ops)

    def _broadcast(self, sequence: int, frame: frames.Parts) -> None:
        self._latest = sequence
        for follower in self._followers.values():
            if follower.streaming:
                follower.send(sequence, frame)
            elif follower.cut is not None:
                follower.buffered.append((sequence, frame))

    # --- confirms -------------------------------------------------------------------------------------------
    def _gate(self, sequence: int, release: Callable[[], None]) -> None:
        """Called by the store on the loop once a batch is on the leader's disk: released in order, once
        replicated."""
        if not self._stopped:
            self._held.append((sequence, release))
            self._release_ready()

    def _replicated(self, sequence: int) -> bool:
        """Whether every copy that may lead has ``sequence``: each member of the committed ISR, and each follower
        about to be added to it (so that it never enters the ISR lacking a confirmed batch)."""
        committed = self._isr.committed
        if not self._isr.enough(len(committed)):
            return False
        for replica in committed:
            if replica.node != self._node:
                follower = self._followers.get(replica.node)
                if follower is None or follower.dir != replica.dir or follower.acked < sequence:
                    return False
        for follower in self._followers.values():
            if follower.in_sync and follower.acked < sequence:
                return False
        return True

    def _release_ready(self) -> None:
        held = self._held
        while held and self._replicated(held[0][0]):
            sequence, release = held.popleft()
            self._released = sequence
            release()

    # --- the ISR --------------------------------------------------------------------------------------------
    def _live(self) -> tuple[Replica, ...]:
        """This leader and every follower in sync, as the ISR names them."""
        return (Replica(self._node, self._dir, self._latest, self._epoch),
                *(Replica(follower.node, follower.dir, follower.acked, follower.epoch)
                  for _, follower in sorted(self._followers.items()) if follower.in_sync))

    def _drop(self, follower: Follower, reason: str) -> None:
        if follower.closed:
            return
        log.warning("follower %s dropped: %s", follower.node, reason)
        follower.close()
        if self._followers.get(follower.node) is follower:
            del self._followers[follower.node]
        self._isr.changed.set()

    async def _keep_followers(self) -> None:
        """Every quarter of ack_timeout: drop a follower that left a frame unacked, or (once it streams) said
        nothing, for ack_timeout; send a heartbeat to each that was sent nothing for that quarter."""
        period = self._ack_timeout / 4
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for follower in list(self._followers.values()):
                if follower.unacked and now - follower.unacked[0][1] > self._ack_timeout:
                    self._drop(follower, f"a frame unacked for {now - follower.unacked[0][1]:.1f} s")
                elif follower.streaming and now - follower.heard_at > self._ack_timeout:
                    self._drop(follower, f"no word from it for {now - follower.heard_at:.1f} s")
                elif now - follower.written_at >= period:
                    follower.write([frames.HEARTBEAT_MESSAGE])

    # --- one follower's connection --------------------------------------------------------------------------
    async def _serve_follower(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)
        peer = writer.get_extra_info("peername")
        address = peer[0] if peer else ""
        if self._unproven[address] >= UNPROVEN_PER_ADDRESS or self._unproven.total() >= UNPROVEN_MAX:
            peer_log.warning(address, "replication connection from %s refused: too many connections are proving "
                                      "the cluster's secret already", peer)
            writer.close()
            return
        self._unproven[address] += 1
        stream = frames.Reader()
        try:
            hello = await asyncio.wait_for(self._proven_hello(reader, writer, stream), self._ack_timeout * 5)
        except (frames.FrameError, asyncio.TimeoutError, OSError, asyncio.IncompleteReadError) as error:
            peer_log.warning(address, "replication connection from %s refused: %s", peer, error or "no proof in time")
            writer.close()
            return
        finally:
            self._unproven[address] -= 1
            if not self._unproven[address]:
                del self._unproven[address]
        if hello.node == self._node:
            log.warning("replication connection from %s refused: it claims this leader's node id", peer)
            writer.close()
            return
        if hello.epoch > self._epoch:
            self._lost(f"follower {hello.node} has seen epoch {hello.epoch}, newer than this leader's")
            await self._refuse(reader, writer, f"this leader's epoch {self._epoch} is older than {hello.epoch}")
            return
        if hello.store_format < STORE_FORMAT:  # its files would be in a format it cannot read
            why = (f"this leader runs Warren {version()} and writes store format {STORE_FORMAT}; {hello.node[:100]} "
                   f"runs Warren {hello.version} and reads store formats up to {hello.store_format}: upgrade the "
                   f"followers before the leader")
            peer_log.warning(address, "replication connection from %s refused: %s", peer, why)
            await self._refuse(reader, writer, why)
            return
        stream.limit = frames.MAX_MANIFEST
        try:
            holds = frames.decode_manifest(await asyncio.wait_for(
                self._read_one(reader, stream, frames.MANIFEST, "manifest"), self._ack_timeout * 5))
        except (frames.FrameError, asyncio.TimeoutError, OSError) as error:  # (ssl.SSLError: a damaged record)
            log.warning("replication connection from %s (%s) refused: %s", peer, hello.node,
                        error or "no manifest in time")
            writer.close()
            return
        stream.limit = ACK_LIMIT
        if (old := self._followers.get(hello.node)) is not None:
            self._drop(old, "it connected again")
        follower = Follower(hello.node, hello.dir, holds, self._epoch, writer)
        self._followers[hello.node] = follower
        join = asyncio.ensure_future(self._join(follower))
        try:
            await self._read_acks(follower, reader, stream)
        except OSError:
            pass  # dropped below, as a follower that closes (or whose TLS record was damaged)
        finally:
            join.cancel()
            self._drop(follower, "its connection closed")

    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, why: str) -> None:
        """Tell a follower why it is refused, and close once it has read that (it closes), or after ack_timeout:
        closed with bytes it sent meanwhile unread, the connection is reset, and the refusal lost on the way."""
        writer.write(frames.encode_refuse(why))
        try:
            async with asyncio.timeout(self._ack_timeout):
                await writer.drain()
                while await reader.read(65536):
                    pass
        except (TimeoutError, OSError):
            pass
        finally:
            writer.close()

    @staticmethod
    async def _read_one(reader: asyncio.StreamReader, stream: frames.Reader, kind: int, what: str) -> bytes:
        """The payload of the next message, which must be of ``kind``; what follows it stays in ``stream``."""
        data = b""
        while True:
            for got, payload in stream.feed(data, at_most=1):
                if got != kind:
                    raise frames.FrameError(f"expected {what}, got message kind {got}")
                return payload
            data = await reader.read(65536)
            if not data:
                raise ConnectionError(f"closed before its {what}")

    async def _proven_hello(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                            stream: frames.Reader) -> frames.Hello:
        """A follower's hello, once the follower has proven it knows the cluster's secret: the leader's challenge
        answers its nonce, and its proof must answer the leader's (FrameError saying why not)."""
        payload = await self._read_one(reader, stream, frames.HELLO, "hello")
        hello = frames.decode_hello(payload)
        answered, challenge = node_proof.challenge(self._key, hello.nonce, payload)
        writer.write(frames.encode(frames.CHALLENGE, challenge))
        given = await self._read_one(reader, stream, frames.PROOF, "proof")
        if not node_proof.check(node_proof.proof(self._key, node_proof.ASKS, hello.nonce, answered, payload), given):
            await self._refuse(reader, writer, "wrong proof of the cluster's secret")
            raise frames.FrameError(f"node {hello.node[:100]!r} gave a wrong proof of the cluster's secret")
        return hello

    async def _read_acks(self, follower: Follower, reader: asyncio.StreamReader, stream: frames.Reader) -> None:
        data = b""  # what the stream holds already comes first
        while not follower.closed:
            try:
                for kind, payload in stream.feed(data):
                    if kind == frames.HEARTBEAT:
                        continue
                    if kind == frames.ACK:
                        self._on_ack(follower, frames.decode_ack(payload))
                    elif kind == frames.REFUSE:
                        log.warning("follower %s refused the stream: %s", follower.node, payload.decode(errors="replace"))
                        return
                    else:
                        raise frames.FrameError(f"unexpected message kind {kind} from a follower")
            except frames.FrameError as error:
                log.warning("follower %s sent a bad message: %s", follower.node, error)
                return
            data = await reader.read(65536)
            if not data:
                return
            follower.heard_at = time.monotonic()

    def _on_ack(self, follower: Follower, sequence: int) -> None:
        if sequence <= follower.acked:
            return
        if sequence > follower.sent:
            raise frames.FrameError(f"an ack of sequence {sequence}, beyond the {follower.sent} sent")
        follower.acknowledged(sequence)
        if not follower.in_sync and follower.streaming and sequence >= max(follower.target, self._released):
            follower.in_sync = True
            log.info("follower %s caught up at sequence %d", follower.node, sequence)
            self._isr.changed.set()
        if self._held:
            self._release_ready()

    # --- a join ---------------------------------------------------------------------------------------------
    async def _join(self, follower: Follower) -> None:
        try:
            async with self._join_lock:
                await self._copy_and_stream(follower)
        except (OSError, ReplicaError, asyncio.TimeoutError) as error:
            self._drop(follower, f"its copy failed: {error or type(error).__name__}")

    async def _copy_and_stream(self, follower: Follower) -> None:
        await self._isr.left(follower.node)  # before its copy is rewritten
        await self.store_ready.wait()
        sequence, files = await self._take_cut(follower)
        started = time.monotonic()
        try:
            sent, held = await self._copy(follower, files)
        finally:
            for _, fd, _ in files:
                os.close(fd)
        follower.send(sequence, frames.frame_parts(self._epoch, sequence, [END_OF_COPY]))
        for later, frame in follower.buffered:
            follower.send(later, frame)
        follower.buffered = []
        follower.heard_at = time.monotonic()  # its silence counts from now: until now it was busy with the copy
        follower.streaming = True
        follower.target = max(sequence, follower.sent)
        log.info("follower %s got a copy of %d files (%d bytes sent, %d it held already) at sequence %d in %.2f s",
                 follower.node, len(files), sent, held, sequence, time.monotonic() - started)

    async def _take_cut(self, follower: Follower) -> tuple[int, list[tuple[str, int, int]]]:
        """Ask the writer for a cut and wait for it; its fds are the caller's (closed here if it never gets them).
        The follower's ``followed`` gets the cut's files whose digests the writer's frames kept."""
        taken: asyncio.Future[tuple[int, list[tuple[str, int, int]]]] = self._loop.create_future()

        def cut(sequence: int, files: list[tuple[str, int, int]]) -> None:  # on the writer thread, between batches
            follower.followed = self._digests.at_cut(files)
            self._loop.call_soon_threadsafe(self._cut_taken, follower, taken, sequence, files)
        self._store.request_cut(cut)
        try:
            done, _ = await asyncio.wait({taken}, timeout=CUT_TIMEOUT)
        except BaseException:  # cancelled: a cut that came meanwhile is closed here, a later one by _cut_taken
            if taken.done() and not taken.cancelled() and taken.exception() is None:
                for _, fd, _ in taken.result()[1]:
                    os.close(fd)
            taken.cancel()
            raise
        if not done:
            taken.cancel()
            raise asyncio.TimeoutError(f"no cut of the store's files within {CUT_TIMEOUT:.0f} s")
        return taken.result()

    def _cut_taken(self, follower: Follower, taken: asyncio.Future, sequence: int,
                   files: list[tuple[str, int, int]]) -> None:
        if taken.done() or follower.closed:
            for _, fd, _ in files:
                os.close(fd)
            return
        if sequence < 0:
            taken.set_exception(ReplicaError("the store could not take a cut of its files"))
            return
        follower.cut = sequence
        follower.sent = sequence
        taken.set_result((sequence, files))

    async def _copy(self, follower: Follower, files: list[tuple[str, int, int]]) -> tuple[int, int]:
        """Send the files as they were at the cut: a RESET keeping the follower's files that are a prefix of the
        leader's, then what each file lacks; returns the bytes sent and the bytes the follower held already."""
        candidates = [(path, fd, held) for path, fd, size in files
                      if (held := follower.holds.get(path)) is not None and 0 < held[0] <= size]
        digests = await asyncio.gather(*(self._loop.run_in_executor(None, self._prefix_digest, follower, path, fd,
                                                                    held[0])
                                         for path, fd, held in candidates))  # on several threads: hashing frees the GIL
        kept = {path: held[0] for (path, _, held), digest in zip(candidates, digests) if digest == held[1]}
        follower.write(frames.frame_parts(self._epoch, -1, ops_parts([reset_op(sorted(kept))])))
        sent = 0
        for path, fd, size in files:
            offset = kept.get(path, 0)
            if path in kept and offset == size:
                continue
            while True:
                count = min(COPY_CHUNK, size - offset)
                data = await self._loop.run_in_executor(None, os.pread, fd, count, offset) if count else b""
                if len(data) != count:
                    raise ReplicaError(f"{path} shrank below its size at the cut")
                follower.write(frames.frame_parts(self._epoch, -1, ops_parts([(APPEND, path, data)])))
                await asyncio.wait_for(follower.writer.drain(), STALLED_COPY)
                offset += count
                sent += count
                if offset >= size:
                    break
        return sent, sum(kept.values())

    @staticmethod
    def _prefix_digest(follower: Follower, path: str, fd: int, size: int) -> str:
        running = follower.followed.get(path)
        return prefix_digest(fd, size) if running is None else running.prefix_digest(fd, size)


class LeadershipLost(Exception):
    """etcd says this node is not (or no longer) the leader."""
