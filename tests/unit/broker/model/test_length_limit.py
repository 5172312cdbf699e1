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


def queue_of(limit: limits.LengthLimit, count: int, size: int = 1) -> FifoEntries:
    """A queue holding `count` messages admitted one by one under `limit`."""
    entries = FifoEntries()
    for seq in range(count):
        newcomer = entry(seq, size)
        assert limit.admit(entries, newcomer.message) == (limits.ENQUEUED, [])
        entries.append(newcomer)
    return entries


def seqs(entries) -> list[int]:
    return [queued.seq for queued in entries]


def test_no_limit_argument_means_no_limit():
    assert limits.LengthLimit.from_arguments({"x-message-ttl": 5}) is None


def test_overflow_defaults_to_drop_head():
    limit = limits.LengthLimit.from_arguments({"x-max-length": 2})
    entries = queue_of(limit, 2)
    outcome, dropped = limit.admit(entries, entry(2).message)
    assert (outcome, seqs(dropped), seqs(entries)) == (limits.ENQUEUED, [0], [1])


def test_drop_head_drops_the_oldest_until_the_newcomer_fits_by_count():
    limit = limits.LengthLimit(3, None, "drop-head")
    entries = queue_of(limit, 3)
    outcome, dropped = limit.admit(entries, entry(3).message)
    assert outcome == limits.ENQUEUED
    assert seqs(dropped) == [0]
    assert seqs(entries) == [1, 2]  # the caller appends the newcomer


def test_drop_head_by_bytes_drops_as_many_as_the_newcomer_needs():
    limit = limits.LengthLimit(None, 10, "drop-head")
    entries = queue_of(limit, 5, size=2)  # 10 bytes: full
    outcome, dropped = limit.admit(entries, entry(5, size=5).message)
    assert (outcome, seqs(dropped), seqs(entries)) == (limits.ENQUEUED, [0, 1, 2], [3, 4])
    assert limit.ready_bytes == 2 + 2 + 5


def test_both_limits_apply_and_the_stricter_one_decides():
    limit = limits.LengthLimit(10, 4, "drop-head")
    entries = queue_of(limit, 4)
    outcome, dropped = limit.admit(entries, entry(4).message)
    assert (outcome, seqs(dropped)) == (limits.ENQUEUED, [0])


def test_reject_publish_refuses_the_newcomer_and_keeps_the_queue():
    for overflow in ("reject-publish", "reject-publish-dlx"):
        limit = limits.LengthLimit(2, None, overflow)
        entries = queue_of(limit, 2)
        assert limit.admit(entries, entry(2).message) == (limits.REFUSED, [])
        assert seqs(entries) == [0, 1]
        assert limit.dead_letter_refused == (overflow == "reject-publish-dlx")


def test_a_message_larger_than_the_byte_limit_is_dropped_without_emptying_the_queue():
    limit = limits.LengthLimit(None, 4, "drop-head")
    entries = queue_of(limit, 2)
    assert limit.admit(entries, entry(2, size=5).message) == (limits.DROPPED, [])
    assert seqs(entries) == [0, 1]
    assert limit.ready_bytes == 2


def test_a_zero_length_limit_keeps_nothing():
    limit = limits.LengthLimit(0, None, "drop-head")
    assert limit.admit(FifoEntries(), entry(0).message) == (limits.DROPPED, [])
    assert limits.LengthLimit(0, None, "reject-publish").admit(FifoEntries(), entry(0).message) == (limits.REFUSED, [])


def test_after_a_requeue_drop_head_trims_the_oldest_back_to_the_limit():
    limit = limits.LengthLimit(2, None, "drop-head")
    entries = queue_of(limit, 2)
    delivered = [limit.removed(entries.popleft()) for _ in range(2)]  # taken by a consumer, not yet acked
    for seq in (2, 3):  # two newer messages fill the queue again
        newcomer = entry(seq)
        assert limit.admit(entries, newcomer.message) == (limits.ENQUEUED, [])
        entries.append(newcomer)
    limit.returned(delivered)  # the consumer's channel closes: both are requeued at the head
    entries.extendleft(reversed(delivered))
    assert seqs(limit.trim(entries)) == [0, 1]
    assert seqs(entries) == [2, 3]
    assert limit.ready_bytes == 2


def test_reject_publish_never_trims():
    limit = limits.LengthLimit(1, None, "reject-publish")
    entries = FifoEntries([entry(0), entry(1)])
    limit.returned(entries)
    assert limit.trim(entries) == []
    assert seqs(entries) == [0, 1]


def test_cleared_forgets_the_bytes_of_a_purged_queue():
    limit = limits.LengthLimit(None, 4, "drop-head")
    entries = queue_of(limit, 4)
    entries.clear()
    limit.cleared()
    assert seqs(queue_of(limit, 4)) == [0, 1, 2, 3]
