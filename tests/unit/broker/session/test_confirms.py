from hypothesis import given, settings
from hypothesis import strategies as st

from broker.model.counters import NodeCounters
from broker.session.confirms import ConfirmTracker


def publish(tracker: ConfirmTracker, count: int) -> list[int]:
    return [tracker.next_seq() for _ in range(count)]


def test_sequence_numbers_start_at_one_and_are_outstanding():
    tracker = ConfirmTracker(NodeCounters())
    assert publish(tracker, 3) == [1, 2, 3]
    assert tracker.outstanding() == 3
    assert tracker.drain() == []


def test_in_order_acks_coalesce_into_one_multiple_ack():
    tracker = ConfirmTracker(NodeCounters())
    for seq in publish(tracker, 100):
        tracker.settle(seq)
    assert tracker.drain() == [(100, True, True)]
    assert tracker.outstanding() == 0
    assert tracker.drain() == []


def test_a_single_ack_is_not_multiple():
    tracker = ConfirmTracker(NodeCounters())
    publish(tracker, 2)
    tracker.settle(1)
    assert tracker.drain() == [(1, False, True)]


def test_acks_above_an_outstanding_seq_are_sent_individually_at_once():
    tracker = ConfirmTracker(NodeCounters())
    publish(tracker, 5)
    for seq in (4, 2, 5, 3):
        tracker.settle(seq)
    assert tracker.drain() == [(2, False, True), (3, False, True), (4, False, True), (5, False, True)]
    tracker.settle(1)
    assert tracker.drain() == [(1, False, True)]


def test_acks_below_the_lowest_outstanding_coalesce_the_rest_go_singly():
    tracker = ConfirmTracker(NodeCounters())
    publish(tracker, 6)
    for seq in (1, 2, 3, 5):
        tracker.settle(seq)
    assert tracker.drain() == [(3, True, True), (5, False, True)]
    assert tracker.outstanding() == 2


def test_nacks_are_individual_and_never_covered_by_a_multiple_ack():
    tracker = ConfirmTracker(NodeCounters())
    publish(tracker, 7)
    for seq in (1, 2, 4, 5, 6):
        tracker.settle(seq)
    tracker.settle(3, ack=False)
    tracker.settle(7, ack=False)
    assert tracker.drain() == [(2, True, True), (3, False, False), (6, True, True), (7, False, False)]


def test_first_settlement_wins_and_unknown_seqs_are_ignored():
    tracker = ConfirmTracker(NodeCounters())
    publish(tracker, 2)
    tracker.settle(1, ack=False)
    tracker.settle(1, ack=True)
    tracker.settle(99)
    tracker.settle(0)
    assert tracker.drain() == [(1, False, False)]
    tracker.settle(1)
    assert tracker.drain() == []
    assert tracker.outstanding() == 1


class Client:
    """What a publisher sees: the seqs it still awaits, and how each was answered."""

    def __init__(self) -> None:
        self.awaiting: set[int] = set()
        self.answers: dict[int, bool] = {}

    def receive(self, tag: int, multiple: bool, is_ack: bool, settled_as: dict[int, bool]) -> None:
        assert tag in self.awaiting, f"answer for seq {tag} that is not awaited"
        covered = sorted(seq for seq in self.awaiting if seq <= tag) if multiple else [tag]
        if multiple:
            assert is_ack and len(covered) > 1
        for seq in covered:
            assert seq in settled_as, f"seq {seq} answered while still outstanding"
            assert settled_as[seq] is is_ack, f"seq {seq} answered with the wrong kind"
            self.awaiting.remove(seq)
            self.answers[seq] = is_ack


operations = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.integers(1, 5)),
        st.tuples(st.just("settle"), st.integers(0, 1000), st.booleans()),
        st.tuples(st.just("drain")),
    ),
    max_size=60,
)


@settings(max_examples=400, deadline=None)
@given(operations)
def test_every_settled_seq_is_answered_exactly_once_as_settled(ops):
    tracker = ConfirmTracker(NodeCounters())
    client = Client()
    issued: list[int] = []
    settled_as: dict[int, bool] = {}
    for op in ops + [("drain",)]:
        if op[0] == "publish":
            for seq in publish(tracker, op[1]):
                assert seq == len(issued) + 1
                issued.append(seq)
                client.awaiting.add(seq)
        elif op[0] == "settle" and issued:
            seq = issued[op[1] % len(issued)]
            tracker.settle(seq, op[2])
            settled_as.setdefault(seq, op[2])
        elif op[0] == "drain":
            frames = tracker.drain()
            for frame in frames:
                client.receive(*frame, settled_as)
            # nothing settled is left waiting, and nothing outstanding was answered
            assert client.awaiting == set(issued) - set(settled_as)
            assert tracker.outstanding() == len(client.awaiting)
    assert client.answers == settled_as


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 50), st.sets(st.integers(1, 50)))
def test_one_drain_needs_one_ack_frame_per_nack_plus_one_per_ack_run(count, nacked):
    tracker = ConfirmTracker(NodeCounters())
    publish(tracker, count)
    nacked = {seq for seq in nacked if seq <= count}
    for seq in range(1, count + 1):
        tracker.settle(seq, ack=seq not in nacked)
    frames = tracker.drain()
    ack_runs = sum(1 for seq in range(1, count + 1) if seq not in nacked and (seq == count or seq + 1 in nacked))
    assert len(frames) == len(nacked) + ack_runs
