"""The management API's shared request helpers that need no server: tag rights, tags and required keys as RabbitMQ
reads them, and the escaping of policy refusals. Under test: broker.management.http,
broker.management.views.policies."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from broker.management import http
from broker.model.access import User
from tests.waiting import two_loop_turns


@pytest.mark.parametrize("tags, rights", [
    (["administrator"], {"administrator", "monitoring", "policymaker", "management"}),
    (["monitoring"], {"monitoring", "management"}),
    (["policymaker"], {"policymaker", "management"}),
    (["management"], {"management"}),
    (["impersonator"], set()),
    ([], set()),
    (["monitoring", "policymaker"], {"monitoring", "policymaker", "management"}),
])
def test_tags_grant_the_rights_rabbitmq_gives_them(tags, rights):
    assert http.rights_of(User("u", "", tags=tags)) == rights


@pytest.mark.parametrize("value, tags", [
    ("management,monitoring", ["management", "monitoring"]),
    (" management , ,monitoring ", ["management", "monitoring"]),
    ("", []),
    (["policymaker", " administrator "], ["policymaker", "administrator"]),
    ([], []),
])
def test_tags_are_a_comma_separated_string_or_a_list(value, tags):
    assert http.tag_list(value, "tags") == tags


@pytest.mark.parametrize("value", [5, None, ["a", 1], {"a": "b"}])
def test_other_tags_are_a_bad_request_naming_the_field(value):
    with pytest.raises(http.ApiError) as refused:
        http.tag_list(value, "tags")
    assert (refused.value.status, refused.value.error) == (400, "bad_request")
    assert "tags" in refused.value.reason


def test_missing_keys_are_named_as_rabbitmq_names_them():
    with pytest.raises(http.ApiError) as refused:
        http.require_keys({"configure": ".*"}, ("configure", "write", "read"))
    assert refused.value.reason == "[{key_missing,write},{key_missing,read}]"
    http.require_keys({"pattern": "x", "definition": {}}, ("pattern", "definition"))


def test_a_string_field_must_be_a_string():
    assert http.string_field({}, "description", "") == ""
    assert http.string_field({"description": "d"}, "description") == "d"
    with pytest.raises(http.ApiError) as refused:
        http.string_field({"password": 1}, "password")
    assert refused.value.reason == "password must be a string"


def test_policy_refusals_escape_html_tags():
    assert http.escape_html_tags('was <<"5">> & more') == 'was &lt;&lt;"5"&gt;&gt; &amp; more'


@pytest.mark.parametrize("count", [0, 1, http.ENCODE_SLICE, 2 * http.ENCODE_SLICE + 1])
@pytest.mark.parametrize("shape", ["list", "object of lists"])
def test_a_reply_in_slices_is_compact_json_its_lists_encoded_a_slice_a_loop_turn(count, shape):
    queues = [{"name": f"q{number}", "arguments": {"x-max-length": number}} for number in range(count)]
    items = queues if shape == "list" else {"rabbit_version": "3.10.8", "queues": queues, "policies": [], "n": None,
                                            1: 1.5, True: {None: [2]}}
    turns = []  # what ran on the loop while the list was encoded

    async def encoded():
        async def other():
            while True:
                turns.append(None)
                await asyncio.sleep(0)
        beside = asyncio.ensure_future(other())
        await asyncio.sleep(0)
        turns.clear()
        response = http.reply_in_slices(SimpleNamespace(method="GET"), items)
        whole = isinstance(response.body, bytes)  # (sent with its length, where chunks are written as they come)
        written = response.body if whole else await response.body.as_bytes()
        beside.cancel()
        return response, whole, written

    expected = http.compact_json(items)
    response, whole, written = asyncio.run(encoded())
    assert response.content_type == "application/json"
    assert written.decode() == expected
    assert whole == (count <= http.ENCODE_SLICE)
    assert len(turns) == max(0, (count - 1) // http.ENCODE_SLICE)
    assert queues == [None] * count  # (let go as they were encoded)


@pytest.mark.parametrize("how", ["HEAD", "client gone"])
def test_a_reply_in_slices_not_written_lets_its_items_go_a_slice_every_other_loop_turn(how):
    """A HEAD writes no body, and a client may leave before the end: the items are freed in slices all the same
    (100,000 queues' entries at once held the event loop 0.18 s)."""
    items = [{"name": f"q{number}"} for number in range(3 * http.ENCODE_SLICE)]
    lengths = []  # the list's length every other loop turn, once the reply is dropped

    class Gone:
        async def write(self, chunk: bytes) -> None:
            raise ConnectionResetError

    async def dropped():
        response = http.reply_in_slices(SimpleNamespace(method=how if how == "HEAD" else "GET"), items)
        if how == "client gone":
            with pytest.raises(ConnectionResetError):
                await response.body.write(Gone())
            assert items[:http.ENCODE_SLICE] == [None] * http.ENCODE_SLICE  # (its first slice encoded)
        del response
        for _ in range(6):
            lengths.append(len(items))
            await two_loop_turns()

    asyncio.run(dropped())
    assert lengths[-1] == 0
    assert 3 <= len(set(lengths)) <= 4  # (a slice every other turn: not all at once)
