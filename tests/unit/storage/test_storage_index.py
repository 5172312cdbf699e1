"""The message index on its own: what a segment holds and what forgetting one leaves behind."""

from storage.index import MessageIndex


def test_a_segment_without_publishes_is_forgotten_while_messages_live_in_several_queues():
    index = MessageIndex()
    index.roll(0)
    index.add(1, ("a", "b"))  # one message in two queues
    index.roll(1)  # the next segment gets only a removal record, no publish
    index.remove("a", [1])
    spent = index.segments[1]
    index.roll(2)
    index.forget(spent)  # crashed once: a segment with no publish has no first id to look messages up by
    assert index.home(1) is index.segments[0]
    assert index.remove("b", [1]) == [1]  # the message still lives in its other queue until then


def test_forgetting_a_segment_drops_its_messages_routed_to_several_queues_and_no_others():
    """Walking whichever is shorter, the messages routed to several queues or the segment's ids (a spent segment
    among millions of fanned-out messages cost a pass over all of them)."""
    index = MessageIndex()
    index.roll(0)
    for msg_id in range(10):
        index.add(msg_id, ("a", "b"))
    index.roll(1)
    for msg_id in range(10, 1010):
        index.add(msg_id, ("a",))
    for msg_id in (1010, 1011):
        index.add(msg_id, ("a", "b"))
    index.roll(2)
    index.forget(index.segments[0])  # 12 fanned-out messages, 10 ids in the segment: its ids are walked
    assert sorted(index.multi) == [1010, 1011]
    assert index.remove("a", [1010]) == [1010] and index.remove("b", [1010]) == [1010]
    assert sorted(index.multi) == [1011]  # (1010 left both its queues)
    index.forget(index.segments[1])  # 1 left, 1,002 ids in the segment: the fanned-out messages are walked
    assert index.multi == {}
