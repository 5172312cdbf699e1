"""A listing whose items are made from the objects it shows: a page makes its own items alone, a whole listing makes
every one while letting the event loop turn (broker.management.resources.named_listing, which the queues',
exchanges', connections' and channels' listings use)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from broker.management.resources import named_listing


def listed(query: dict, count: int) -> tuple[object, list[str]]:
    """The reply body of a listing of count items named n0, n1, ..., and the names of the items it made."""
    made: list[str] = []

    def make(shown: SimpleNamespace) -> dict:
        made.append(shown.name)
        return {"name": shown.name}

    shown = [SimpleNamespace(name=f"n{number}") for number in range(count)]
    async def body() -> bytes:
        response = await named_listing(SimpleNamespace(query=query, method="GET"), shown, lambda item: item.name, make)
        return response.body if isinstance(response.body, bytes) else await response.body.as_bytes()  # (a page, or not)
    return json.loads(asyncio.run(body())), made


def test_a_page_makes_only_its_own_items():
    body, made = listed({"page": "2", "page_size": "3", "name": "n1"}, 10_000)
    assert made == ["n12", "n13", "n14"]  # (the second page of those whose name holds n1: n1, n10, n11, n12...)
    assert [item["name"] for item in body["items"]] == made and body["filtered_count"] == 1_111
    assert body["total_count"] == 10_000


def test_a_whole_listing_makes_every_item_in_order():
    body, made = listed({}, 5)
    assert [item["name"] for item in body] == made == ["n0", "n1", "n2", "n3", "n4"]
