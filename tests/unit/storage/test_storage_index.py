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
