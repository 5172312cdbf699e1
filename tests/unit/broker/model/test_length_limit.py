"""Queue length limits as RabbitMQ applies them: x-max-length and x-max-length-bytes count ready messages and
their body bytes; drop-head drops the oldest to make room, reject-publish refuses the newcomer."""

from pamqp.commands import Basic

# The modules under test, named once: the rest of the file uses only these names.
from broker.model.features import length_limit as limits
from broker.model.features.ready import FifoEntries
from broker.model import message as messages
from protocol.codec import encode_header_payload


def entry(seq: int, size: int = 1) -> messages.QueueEntry:
    """A ready message of `size` body bytes; its body names its position in publishing order."""
    body = f"{seq}".encode().ljust(size, b".")
    header = messages.Header(encode_header_payload(len(body), Basic.Properties()))
    return messages.QueueEntry(seq, messages.Message(messages.Address("", "q"), header, body))


class Ready:
    """A queue's ready list and the body bytes it holds, as Queue keeps them, filled under a limit."""

    def __init__(self, limit: limits.LengthLimit, count: int = 0, size: int = 1) -> None:
        self.limit = limit
        self.entries = FifoEntries()
        self.bytes = 0
        for seq in range(count):
            assert self.admit(entry(seq, size)) == (limits.ENQUEUED, [])

    def admit(self, newcomer: messages.QueueEntry) -> tuple[int, list[messages.QueueEntry]]:
        """What the limit says of newcomer; joins the list when admitted."""
        outcome, dropped = self.limit.admit(self.entries, self.bytes, newcomer.message)
        self.bytes -= limits.body_bytes(dropped)
        if outcome == limits.ENQUEUED:
            self.entries.append(newcomer)
            self.bytes += len(newcomer.message.body)
        return outcome, dropped

    def seqs(self) -> list[int]:
        return seqs(self.entries)


def seqs(entries) -> list[int]:
    return [queued.seq for queued in entries]


def test_no_limit_argument_means_no_limit():
    assert limits.LengthLimit.from_arguments({"x-message-ttl": 5}) is None


def test_overflow_defaults_to_drop_head():
    ready = Ready(limits.LengthLimit.from_arguments({"x-max-length": 2}), 2)
    outcome, dropped = ready.admit(entry(2))
    assert (outcome, seqs(dropped), ready.seqs()) == (limits.ENQUEUED, [0], [1, 2])


def test_drop_head_drops_the_oldest_until_the_newcomer_fits_by_count():
    ready = Ready(limits.LengthLimit(3, None, "drop-head"), 3)
    outcome, dropped = ready.admit(entry(3))
    assert (outcome, seqs(dropped), ready.seqs()) == (limits.ENQUEUED, [0], [1, 2, 3])


def test_drop_head_by_bytes_drops_as_many_as_the_newcomer_needs():
    ready = Ready(limits.LengthLimit(None, 10, "drop-head"), 5, size=2)  # 10 bytes: full
    outcome, dropped = ready.admit(entry(5, size=5))
    assert (outcome, seqs(dropped), ready.seqs()) == (limits.ENQUEUED, [0, 1, 2], [3, 4, 5])
    assert ready.bytes == 2 + 2 + 5


def test_both_limits_apply_and_the_stricter_one_decides():
    ready = Ready(limits.LengthLimit(10, 4, "drop-head"), 4)
    outcome, dropped = ready.admit(entry(4))
    assert (outcome, seqs(dropped)) == (limits.ENQUEUED, [0])


def test_reject_publish_refuses_the_newcomer_and_keeps_the_queue():
    for overflow in ("reject-publish", "reject-publish-dlx"):
        ready = Ready(limits.LengthLimit(2, None, overflow), 2)
        assert ready.admit(entry(2)) == (limits.REFUSED, [])
        assert ready.seqs() == [0, 1]
        assert ready.limit.dead_letter_refused == (overflow == "reject-publish-dlx")


def test_a_message_larger_than_the_byte_limit_is_dropped_without_emptying_the_queue():
    ready = Ready(limits.LengthLimit(None, 4, "drop-head"), 2)
    assert ready.admit(entry(2, size=5)) == (limits.DROPPED, [])
    assert (ready.seqs(), ready.bytes) == ([0, 1], 2)


def test_a_zero_length_limit_keeps_nothing():
    assert Ready(limits.LengthLimit(0, None, "drop-head")).admit(entry(0)) == (limits.DROPPED, [])
    assert Ready(limits.LengthLimit(0, None, "reject-publish")).admit(entry(0)) == (limits.REFUSED, [])


def test_after_a_requeue_drop_head_trims_the_oldest_back_to_the_limit():
    ready = Ready(limits.LengthLimit(2, None, "drop-head"), 2)
    delivered = [ready.entries.popleft() for _ in range(2)]  # taken by a consumer, not yet acked
    ready.bytes -= limits.body_bytes(delivered)
    for seq in (2, 3):  # two newer messages fill the queue again
        assert ready.admit(entry(seq)) == (limits.ENQUEUED, [])
    ready.entries.extendleft(reversed(delivered))  # the consumer's channel closes: both are requeued at the head
    ready.bytes += limits.body_bytes(delivered)
    assert ready.limit.over(ready.entries, ready.bytes)
    assert seqs(ready.limit.trim(ready.entries, ready.bytes, 10)) == [0, 1]
    assert ready.seqs() == [2, 3]


def test_a_trim_drops_at_most_as_many_as_it_is_asked_to():
    ready = Ready(limits.LengthLimit(None, 100, "drop-head"), 10, size=10)
    ready.limit = limits.LengthLimit(None, 30, "drop-head")  # a policy lowers it: seven too many
    assert seqs(ready.limit.trim(ready.entries, ready.bytes, 4)) == [0, 1, 2, 3]
    assert seqs(ready.limit.trim(ready.entries, ready.bytes - 40, 4)) == [4, 5, 6]
    assert not ready.limit.over(ready.entries, ready.bytes - 70)


def test_reject_publish_never_trims():
    limit = limits.LengthLimit(1, None, "reject-publish")
    entries = FifoEntries([entry(0), entry(1)])
    assert not limit.over(entries, 2) and limit.trim(entries, 2, 10) == []
    assert seqs(entries) == [0, 1]
