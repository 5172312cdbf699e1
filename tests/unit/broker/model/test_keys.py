"""Store keys are made of the names that identify an object, as RabbitMQ identifies a resource by the pair (vhost,
name): no two objects share one, whatever characters their names hold, and names without "|", "\\" or NUL keep the
key they had when names were joined as they were."""

from __future__ import annotations

import itertools

from broker.model.keys import (
    DELAYED_PREFIX, binding_key, composite_key, delayed_key, exchange_key, permission_key, policy_key, queue_key,
)

# names made of the characters keys escape, and of the escape sequences themselves
AWKWARD = ["", "a", "b", "|", "||", "a|b", "b|c", "\\", "\\|", "a\\", "\\\\|", "\x00", "a\x00b", "\\0", "|\x00|"]


def test_the_reported_queues_get_keys_of_their_own():
    assert queue_key("a", "b|c") != queue_key("a|b", "c")
    assert exchange_key("a", "b|c") != exchange_key("a|b", "c")
    assert delayed_key("a", "b|c") != delayed_key("a|b", "c")


def test_no_two_pairs_of_names_share_a_key():
    pairs = list(itertools.product(AWKWARD, repeat=2))
    for make in (queue_key, exchange_key, delayed_key, policy_key, permission_key):
        assert len({make(*pair) for pair in pairs}) == len(pairs), make.__name__


def test_nul_in_names_no_longer_makes_two_policies_permissions_or_bindings_one():
    assert policy_key("a\x00b", "c") != policy_key("a", "b\x00c")
    assert permission_key("a\x00b", "c") != permission_key("a", "b\x00c")
    assert binding_key("v", "x", "queue", "q", "a\x00b", "") != binding_key("v", "x", "queue", "q", "a", "b")
    assert binding_key("v|x", "queue", "q", "", "", "") != binding_key("v", "x|queue", "q", "", "", "")


def test_no_two_lists_of_names_share_a_key_whatever_their_lengths():
    lists = [names for count in (1, 2, 3) for names in itertools.product(AWKWARD, repeat=count)]
    assert len({composite_key(*names) for names in lists}) == len(lists)


def test_names_without_the_escaped_characters_keep_the_key_they_had():
    assert queue_key("/", "orders") == "/|orders"
    assert queue_key("tenant-1", "q.1 x") == "tenant-1|q.1 x"
    assert delayed_key("/", "later") == DELAYED_PREFIX + "/|later"


def test_no_key_made_of_names_is_a_delayed_exchanges_key():
    """A delayed exchange's key starts with a NUL, which no key made of names holds: not even vhost
    "\\x00delayed"'s."""
    assert all("\x00" not in composite_key(*names) for names in itertools.product(AWKWARD, repeat=2))
    assert queue_key("\x00delayed", "/|later") != delayed_key("/", "later")
