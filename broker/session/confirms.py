"""Publisher-confirm bookkeeping of one channel, in the spirit of RabbitMQ's rabbit_confirms.

Every publish on a channel in confirm mode takes the next sequence number. When the broker is done with a
publish (routed and, if durable, on disk; or failed) the channel settles it as an ack or a nack. drain() turns
everything settled since the last drain into basic.ack / basic.nack frames:

- acks below the lowest seq still outstanding, and not beyond an unanswered nack, go out as one
  ``multiple=True`` ack (``multiple=False`` when the run holds a single seq);
- each nack goes out on its own, and the acks after it start a new run;
- acks above an outstanding seq go out one by one at once, so no answer waits for an unrelated publish.

Under load publishes settle roughly in order, so a drain usually costs a single frame. A client never receives
a multiple ack that covers a seq it is still waiting on, other than the acks being sent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker.model.counters import NodeCounters


class ConfirmTracker:
    """Publisher-confirm sequence numbers of one channel (like RabbitMQ's rabbit_confirms)."""

    def __init__(self, counters: NodeCounters) -> None:
        self.counters = counters  # the node's (model.counters.NodeCounters): counts the acks
        self._next_seq = 1  # seq the next publish receives
        self._outstanding: set[int] = set()  # seqs issued and not yet settled
        self._lowest_candidate = 1  # no seq below this is outstanding (advanced lazily)
        self._settled: list[tuple[int, bool]] = []  # (seq, is_ack) settled since the last drain

    def next_seq(self) -> int:
        seq = self._next_seq
        self._next_seq = seq + 1
        self._outstanding.add(seq)
        return seq

    def settle(self, seq: int, ack: bool = True) -> None:
        """The broker is done with seq: ack it, or nack it if not ack. The first settlement of a seq wins;
        settling an unknown or already settled seq is ignored, as rabbit_confirms ignores late confirms."""
        if seq in self._outstanding:
            self._outstanding.remove(seq)
            self._settled.append((seq, ack))
            if ack:
                self.counters.confirmed += 1

    def drain(self) -> list[tuple[int, bool, bool]]:
        """Frames to send now, in order, as (delivery_tag, multiple, is_ack); answers every settled seq once."""
        if not self._settled:
            return []
        settled = self._settled
        self._settled = []
        settled.sort()
        floor = self._lowest_outstanding()
        frames: list[tuple[int, bool, bool]] = []
        run_top = 0  # highest seq of the acks waiting to go out as one frame
        run_length = 0  # how many acks that frame answers
        for seq, is_ack in settled:
            if is_ack and seq < floor:
                run_top = seq
                run_length += 1
                continue
            if run_length:
                frames.append((run_top, run_length > 1, True))
                run_length = 0
            frames.append((seq, False, is_ack))
        if run_length:
            frames.append((run_top, run_length > 1, True))
        return frames

    def outstanding(self) -> int:
        return len(self._outstanding)

    def _lowest_outstanding(self) -> int:
        """The smallest outstanding seq, or the next seq to issue when none is outstanding."""
        candidate = self._lowest_candidate
        limit = self._next_seq
        outstanding = self._outstanding
        while candidate < limit and candidate not in outstanding:
            candidate += 1
        self._lowest_candidate = candidate
        return candidate
