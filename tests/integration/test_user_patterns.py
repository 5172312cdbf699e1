"""Regular expressions a user supplies (a listing filter, a policy's pattern, a permission) cannot stall the broker:
a pattern that makes a backtracking engine run for minutes answers at once, and AMQP clients are not held up. A
pattern Warren's linear-time engine cannot run is refused with 400 saying why (RabbitMQ's PCRE runs look-arounds;
Warren refuses them rather than risk a pattern that runs for hours)."""

import random
import re
import threading
import time

import pytest

from tests.integration.helpers import open_channel
from tests.integration.management import (
    add_user, clear_policy, delete_user, quote, request, set_policy,
)

# 'a' repeated this often makes (a+)+ backtrack 2**30 times in a backtracking engine: minutes of Python's re
RUN_LENGTH = 30
QUICK = 2.0  # seconds: what the slowest of these requests may take (RabbitMQ's PCRE stops at a match limit: 0.3 s)


def warren_only(broker) -> None:
    if broker.external:
        pytest.skip("Warren refuses patterns RabbitMQ's PCRE runs (look-arounds, back-references)")


def test_a_backtracking_listing_filter_answers_at_once(broker, unique):
    with open_channel(broker) as ch:
        ch.queue_declare(f"{unique}-" + "a" * RUN_LENGTH + "!", auto_delete=True)
        pattern = quote(f"^{re.escape(unique)}-(a+)+$")
        started = time.monotonic()
        reply = request(broker, "GET", f"/api/queues/%2F?name={pattern}&use_regex=true&page=1", timeout=QUICK * 2)
        assert time.monotonic() - started < QUICK
        assert reply.status == 200 and reply.body["items"] == []


def test_a_backtracking_policy_pattern_does_not_slow_queue_declares(broker, unique):
    set_policy(broker, "/", unique, f"^{re.escape(unique)}-(a+)+$", {"max-length": 5}, apply_to="queues")
    try:
        with open_channel(broker) as ch:
            started = time.monotonic()
            for number in range(5):
                ch.queue_declare(f"{unique}-" + "a" * RUN_LENGTH + f"!{number}", auto_delete=True)
            assert time.monotonic() - started < QUICK
    finally:
        clear_policy(broker, "/", unique)


@pytest.mark.parametrize("pattern", ["^(?=q)", r"(q)\1"])
def test_a_pattern_the_linear_time_engine_cannot_run_is_refused_by_every_door(broker, unique, pattern):
    warren_only(broker)
    policy = request(broker, "PUT", f"/api/policies/%2F/{unique}",
                     {"pattern": pattern, "definition": {"max-length": 1}, "apply-to": "queues"})
    assert policy.status == 400 and "not supported" in policy.body["reason"]
    user = f"{unique}-user"
    add_user(broker, user, "secret")
    try:
        permission = request(broker, "PUT", f"/api/permissions/%2F/{quote(user)}",
                             {"configure": pattern, "write": ".*", "read": ".*"})
        assert permission.status == 400 and "not supported" in permission.body["reason"]
    finally:
        delete_user(broker, user)
    listing = request(broker, "GET", f"/api/queues?name={quote(pattern)}&use_regex=true&page=1")
    assert listing.status == 400 and "not supported" in listing.body["reason"]
    definitions = request(broker, "POST", "/api/definitions", {"policies": [
        {"vhost": "/", "name": unique, "pattern": pattern, "definition": {"max-length": 1}, "apply-to": "queues",
         "priority": 0}]})
    assert definitions.status == 400 and "not supported" in definitions.body["reason"]


def test_a_pattern_that_would_compile_too_big_is_refused(broker, unique):
    warren_only(broker)
    reply = request(broker, "PUT", f"/api/operator-policies/%2F/{unique}",
                    {"pattern": "[a-z]{1,1000}" * 10, "definition": {"max-length": 1}, "apply-to": "queues"})
    assert reply.status == 400 and "too complex" in reply.body["reason"]


COSTLIEST = "[ab]*a[ab]{900}"  # about a millisecond for each 255-letter name of a's and b's


def slowest_round_trip_during(broker, ch, queue: str, *api_call, **options) -> float:
    """Seconds of the slowest AMQP round trip (a passive declare of queue) while the API call runs."""
    call = threading.Thread(target=request, args=(broker, *api_call), kwargs={"timeout": 60, **options})
    call.start()
    round_trips = []
    while call.is_alive():
        started = time.monotonic()
        ch.queue_declare(queue, passive=True)
        round_trips.append(time.monotonic() - started)
    call.join()
    return max(round_trips)


def long_names(unique: str, count: int) -> list[str]:
    letters = random.Random(unique)
    return [unique + "-" + "".join(letters.choice("ab") for _ in range(250 - len(unique))) for _ in range(count)]


@pytest.mark.alone
def test_a_filter_slow_on_every_name_does_not_hold_amqp_up_while_it_runs(broker, unique):
    """The costliest pattern RE2 takes, over a thousand queues: the filter runs for a second, and AMQP clients go
    on meanwhile."""
    names = long_names(unique, 1000)
    with open_channel(broker) as ch:
        for name in names:
            ch.queue_declare(name, auto_delete=True)
        slowest = slowest_round_trip_during(
            broker, ch, names[0], "GET", f"/api/queues/%2F?name={quote(COSTLIEST)}&use_regex=true&page=1")
    assert slowest < 0.1, f"slowest round trip: {slowest * 1000:.0f} ms"


@pytest.mark.alone
def test_a_policy_slow_on_every_name_is_applied_without_holding_amqp_up(broker, unique):
    names = long_names(unique, 1000)
    with open_channel(broker) as ch:
        for name in names:
            ch.queue_declare(name, auto_delete=True)
        costly_and_matching = f"^{re.escape(unique)}-[ab]*a[ab]{{100}}"  # also costly: ~0.5 ms a name
        slowest = slowest_round_trip_during(broker, ch, names[0], "PUT", f"/api/policies/%2F/{unique}", {
            "pattern": costly_and_matching, "definition": {"max-length": 7}, "apply-to": "queues"})
        try:
            shown = request(broker, "GET", f"/api/queues/%2F/{quote(names[-1])}").body
            assert shown["effective_policy_definition"] == {"max-length": 7}
        finally:
            slowest = max(slowest, slowest_round_trip_during(broker, ch, names[0], "DELETE",
                                                             f"/api/policies/%2F/{unique}"))
    assert slowest < 0.1, f"slowest round trip: {slowest * 1000:.0f} ms"
