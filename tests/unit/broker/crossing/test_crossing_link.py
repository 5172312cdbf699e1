"""One end of a link between two processes (broker.crossing.link): the frames of a read are handled in order until a
loop turn's budget is spent, the others in later turns with reading paused meanwhile, so that a burst from the other
process (a vhost's home deleting 100,000 queues) holds this one's clients a few milliseconds at a time."""

from __future__ import annotations

import asyncio
import time

from broker.crossing.frames import NOTICE, frame
from broker.crossing.link import Link
from broker.model.turns import TURN_SECONDS

FRAMES = 12  # each handled in a third of a turn's budget


class Transport:
    """What the link asks of its socket: reading paused and resumed, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def pause_reading(self) -> None:
        self.calls.append("pause")

    def resume_reading(self) -> None:
        self.calls.append("resume")


class Slow:
    """A handler that takes a third of a turn's budget for each frame, noting each payload and the turn it came in."""

    def __init__(self) -> None:
        self.handled: list[tuple[bytes, int]] = []
        self.turn = 0

    def received(self, kind: int, payload: bytes) -> None:
        ends = time.perf_counter() + TURN_SECONDS / 3
        while time.perf_counter() < ends:
            pass
        self.handled.append((payload, self.turn))

    def flushing(self) -> None:
        pass

    def lost(self) -> None:
        pass


def test_a_read_of_many_frames_is_handled_a_turns_budget_at_a_time_in_order_reading_paused_meanwhile():
    handler, transport = Slow(), Transport()

    async def scenario() -> None:
        link = Link(handler, "worker 1")
        link.connection_made(transport)
        link.data_received(b"".join(frame(NOTICE, b"%d" % number) for number in range(FRAMES)))
        assert len(handler.handled) < FRAMES and transport.calls == ["pause"]
        handler.turn = 1  # (the read's own turn ends here)
        while len(handler.handled) < FRAMES:
            await asyncio.sleep(0)
            handler.turn += 1
        await asyncio.sleep(0)

    asyncio.run(scenario())
    assert [payload for payload, _ in handler.handled] == [b"%d" % number for number in range(FRAMES)]
    per_turn = [sum(1 for _, turn in handler.handled if turn == at) for at in {turn for _, turn in handler.handled}]
    assert max(per_turn) <= 4 and len(per_turn) >= 3, per_turn
    assert transport.calls == ["pause", "resume"]
