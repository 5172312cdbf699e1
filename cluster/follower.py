"""The follower's end of the replication stream (the leader's is cluster.replication).

``ReplicaClient``, on a thread of its own: the frames that have arrived go to a ``storage.replica.ReplicaWriter``
as one group (group commit); the highest sequence it has made durable is acked. A leader silent for twice
``ack_timeout`` ends the stream (the node connects again). The newest leader epoch seen is kept in
``cluster-state`` in the data dir, written durably before a frame of a newer epoch is applied; frames of an older
epoch are refused.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
import time
from collections.abc import Callable
from pathlib import Path

from broker.connection.server import version
from cluster import frames
from cluster.state import identity, read_epoch, write_epoch
from protocol import node_proof
from storage.format import CURRENT as STORE_FORMAT
from storage.digests import RunningDigests, file_digests
from storage.replica import Frame, ReplicaError, ReplicaWriter, decode_ops

READ_SIZE = 1 << 20  # bytes a follower reads from its stream at once
LEADER_SILENCE = 2.0  # ack timeouts a follower waits for any word from its leader before it connects again


def arrived(stream: socket.socket) -> bytes | None:
    """What has arrived on a follower's stream besides, without waiting for more (None: nothing); over TLS, what the
    session has decrypted already (the rest comes with the next read)."""
    if isinstance(stream, ssl.SSLSocket):
        pending = stream.pending()
        return stream.recv(pending) if pending else None
    try:
        return stream.recv(READ_SIZE, socket.MSG_DONTWAIT)
    except BlockingIOError:
        return None


class ReplicaClient:
    """The follower's end: receives a leader's frames into the data dir and acks what is durable.

    The stream runs on a thread of its own with a blocking socket: read what has arrived, apply it as one group
    (``ReplicaWriter``: one fdatasync per file), ack the highest sequence, read again. No event loop sits between the
    socket and the disk, so a confirm waits for no more than the follower's read, write, fdatasync and ack.
    """

    def __init__(self, data_dir: Path, node: str, secret: str, ack_timeout: float,
                 tls: ssl.SSLContext | None = None, group: str = "",
                 applied: Callable[[list[Frame]], None] = lambda group: None,
                 digests: RunningDigests | None = None) -> None:
        self._data_dir = data_dir
        # the data dir's files' digests, followed as frames are applied (the node's, which outlive this client)
        self._digests = RunningDigests(data_dir) if digests is None else digests
        self._applied = applied  # given each group (on the stream's thread) once it is applied and acked
        self._node = node
        self._tls = tls  # [cluster] tls: the connecting side's context (broker.connection.tls.node_contexts)
        self._key = frames.link_key(secret, group)  # what both sides prove the cluster's secret with
        self._dir = identity(data_dir)  # the data dir's identity, made now if it has none
        self._epoch = read_epoch(data_dir)  # the newest epoch accepted
        self._silence = ack_timeout * LEADER_SILENCE  # seconds without a word from the leader that end the stream
        self._connect_timeout = ack_timeout  # seconds a connection to the leader may take
        self._socket: socket.socket | None = None  # the stream's, while it runs
        self._stopped = False  # stop() was called: a stream still connecting ends as soon as it has its socket
        self.acked = -1  # the highest sequence acked to the current leader
        self.heard_at = time.monotonic()  # when the leader last said anything (or, before that, following began)
        self.heard_any = False  # the leader has said something since following began: it is within reach
        self.failure: str | None = None  # why the last stream ended, for the log
        self.disk_failed = False  # it ended because the data dir could not take the leader's writes

    async def follow(self, host: str, port: int, epoch: int) -> None:
        """Follow the leader of ``epoch`` at host:port until the stream ends (returns; ``failure`` says why)."""
        self.failure = None
        self.disk_failed = False
        self._stopped = False
        self.acked = -1  # acks belong to one connection: a new one starts again from its copy
        if epoch < self._epoch:
            self.failure = f"the leader's epoch {epoch} is older than {self._epoch}, seen before"
            return
        await asyncio.get_running_loop().run_in_executor(None, self._stream, host, port)

    @property
    def lost_leader(self) -> bool:
        """Whether the leader has said nothing for longer than the silence that ends a stream."""
        return time.monotonic() - self.heard_at > self._silence

    def stop(self) -> None:
        """End the stream (from any thread): its blocking read returns, or it ends once connected."""
        self._stopped = True
        stream = self._socket
        if stream is not None:
            try:
                stream.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # closed already

    # --- the stream's thread ----------------------------------------------------------------------------------
    def _stream(self, host: str, port: int) -> None:
        try:
            # what it holds, so that the leader sends only what it lacks
            manifest = file_digests(self._data_dir, self._digests)
        except (OSError, ReplicaError) as error:
            self.failure = f"cannot read the data dir's files: {error}"
            self.disk_failed = True
            return
        try:
            stream = socket.create_connection((host, port), timeout=self._connect_timeout)
            if self._tls is not None:  # (its handshake within the same time)
                stream = self._tls.wrap_socket(stream)
        except OSError as error:  # (ssl.SSLError included: a certificate the CA did not sign, say)
            self.failure = f"cannot reach the leader's replication port {host}:{port}: {error}"
            return
        self._socket = stream
        if self._stopped:  # stop() came while it connected, and found no socket to shut down
            self._socket = None
            stream.close()
            return
        if self._tls is not None:  # a TLS read retries past SO_RCVTIMEO: the socket's own timeout ends it
            stream.settimeout(self._silence)
        else:  # a blocking read gives up after the silence (EAGAIN), while MSG_DONTWAIT reads stay non-blocking
            stream.settimeout(None)
            seconds = int(self._silence)
            stream.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                              struct.pack("ll", seconds, int((self._silence - seconds) * 1_000_000)))
        stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        writer = ReplicaWriter(self._data_dir)
        reader = frames.Reader()  # (no more than a hello's size from a leader that has not proven itself)
        try:
            self._prove(stream, reader)
            reader.limit = frames.MAX_PAYLOAD
            stream.sendall(frames.encode_manifest(manifest))
            self._receive(stream, reader, writer)
        except node_proof.ProofError as error:
            self.failure = f"the leader at {host}:{port} is refused: {error}"
        except (frames.FrameError, ReplicaError) as error:
            self.failure = f"bad message from the leader, stream closed: {error}"
        except (BlockingIOError, TimeoutError):  # (TimeoutError: over TLS)
            self.failure = f"no word from the leader for {self._silence:.1f} s: connecting again"
        except OSError as error:
            self.failure = f"replication connection lost: {error}"
        finally:
            self._socket = None
            writer.close()
            stream.close()

    def _prove(self, stream: socket.socket, reader: frames.Reader) -> None:
        """The hello, the leader's challenge checked (ProofError if wrong), and this follower's proof: the secret
        itself is never sent."""
        asked = node_proof.nonce()
        hello = frames.hello_payload(self._node, self._dir, self._epoch, asked, version(), STORE_FORMAT)
        stream.sendall(frames.encode(frames.HELLO, hello))
        messages: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + self._silence  # (each read has it too: a leader may send a byte at a time)
        while not messages:
            data = stream.recv(READ_SIZE)
            if not data:
                raise frames.FrameError("the leader closed the connection before its challenge")
            messages = reader.feed(data, at_most=1)
            if not messages and time.monotonic() > deadline:
                raise frames.FrameError(f"no challenge from the leader within {self._silence:.1f} s")
        [(kind, payload)] = messages
        if kind == frames.REFUSE:
            raise frames.FrameError(f"the leader refused: {payload.decode(errors='replace')}")
        if kind != frames.CHALLENGE:
            raise frames.FrameError(f"expected the leader's challenge, got message kind {kind}")
        answered = node_proof.read_challenge(self._key, asked, payload, hello)
        stream.sendall(frames.encode(frames.PROOF, node_proof.proof(self._key, node_proof.ASKS, asked, answered, hello)))

    def _receive(self, stream: socket.socket, reader: frames.Reader, writer: ReplicaWriter) -> None:
        while True:
            data = stream.recv(READ_SIZE)
            ended = not data
            self.heard_at = time.monotonic()
            self.heard_any = True
            messages = reader.feed(data)
            while not ended:  # everything that has arrived goes into one group (one fdatasync per file)
                more = arrived(stream)
                if more is None:
                    break
                ended = not more
                messages += reader.feed(more)
            group = [self._frame(stream, kind, payload) for kind, payload in messages if kind != frames.HEARTBEAT]
            if len(group) < len(messages):
                self._answer_heartbeat(stream)
            if group:
                try:
                    sequence = writer.apply(group)
                except ReplicaError as error:
                    self._digests.forget()  # (the group may be half applied)
                    self.failure = f"the data dir cannot take the leader's writes: {error}"
                    self.disk_failed = True
                    return
                try:
                    if sequence > self.acked:
                        self.acked = sequence
                        self._acknowledge(stream, sequence)
                finally:  # (hashed after the ack, which it would delay; and whether or not the ack could be sent)
                    for _, ops in group:
                        self._digests.follow(ops)
                self._applied(group)
            if ended:
                self.failure = "the leader closed the replication connection"
                return

    def _acknowledge(self, stream: socket.socket, sequence: int) -> None:
        stream.sendall(frames.encode_ack(sequence))

    def _answer_heartbeat(self, stream: socket.socket) -> None:
        stream.sendall(frames.HEARTBEAT_MESSAGE)

    def _frame(self, stream: socket.socket, kind: int, payload: bytes) -> tuple[int, list]:
        if kind == frames.REFUSE:
            raise frames.FrameError(f"the leader refused: {payload.decode(errors='replace')}")
        if kind != frames.FRAME:
            raise frames.FrameError(f"unexpected message kind {kind} from the leader")
        epoch, sequence, ops = frames.decode_frame(payload)
        if epoch < self._epoch:
            stream.sendall(frames.encode_refuse(f"epoch {epoch} is older than {self._epoch}"))
            raise frames.FrameError(f"a frame of epoch {epoch}, older than {self._epoch}")
        if epoch > self._epoch:
            write_epoch(self._data_dir, epoch)  # durable before any frame of the new epoch is acked
            self._epoch = epoch
        return sequence, decode_ops(ops)
