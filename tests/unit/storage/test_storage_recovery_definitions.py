"""Stored definitions: every value a client can send comes back exactly, no client value can pass for the encoding,
old-format records are still read, and a record that cannot be decoded is set aside without costing the rest."""

from __future__ import annotations

import datetime
import decimal
import json
import logging
import math
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage import records
from storage.definitions_log import DefinitionTable, decode_data, encode_data
from storage.format import CURRENT, UnsupportedFormat
from storage.store import MessageStore
from tests.unit.storage.storage_support import reopen, run


def same(a, b) -> bool:
    """Equal values of the very same types (True is not 1, 1.0 is not 1, NaN is NaN, -0.0 is not 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[key], b[key]) for key in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, decimal.Decimal):
        return str(a) == str(b)
    if isinstance(a, datetime.datetime):
        return a == b and a.utcoffset() == b.utcoffset()
    return a == b


# Keys that meant something to an encoder, past or present: clients may use them too.
TAG_KEYS = ["__warren_bytes__", "__warren_decimal__", "__warren_datetime__", "m", "b", "d", "t"]
offsets = st.integers(-23 * 60, 23 * 60).map(lambda minutes: datetime.timezone(datetime.timedelta(minutes=minutes)))
scalars = (
    st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.binary() | st.decimals()
    | st.datetimes(timezones=st.none() | offsets)
)
keys = st.text() | st.sampled_from(TAG_KEYS)
values = st.recursive(
    scalars, lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(keys, values, max_size=5))
def test_every_value_a_client_can_send_round_trips_exactly(data):
    assert same(decode_data(encode_data(data)), data)


HOSTILE = {
    "bad-base64": {"__warren_bytes__": "not base64!"},
    "percent": {"__warren_bytes__": "%%%"},
    "valid-base64": {"__warren_bytes__": "QUJD"},
    "bad-decimal": {"__warren_decimal__": "nope"},
    "bad-datetime": {"__warren_datetime__": 12},
    "wrapper-lookalike": {"m": {"b": "QUJD"}},
    "bytes-lookalike": {"b": "%%%"},
    "nested": [{"d": "x"}, {"t": "yesterday"}],
}


def test_hostile_one_key_tables_come_back_as_sent_after_a_restart(tmp_path):
    arguments = {"x-foo": dict(HOSTILE), **HOSTILE}
    run(tmp_path, lambda store: (
        store.append_definition("queue", "/|hostile", {"name": "hostile", "arguments": arguments}),
        store.append_definition("queue", "/|plain", {"name": "plain", "arguments": {}}),
    ))
    recovered = reopen(tmp_path)
    assert same(recovered.queues, [{"name": "hostile", "arguments": arguments}, {"name": "plain", "arguments": {}}])
    assert recovered.report["set_aside_records"] == 0


def legacy_record(kind: str, name: str, data_json: str) -> bytes:
    """A DEFINITION record of the first format, as the previous version wrote it."""
    kind_b, name_b = kind.encode(), name.encode()
    return records.frame(struct.pack("<BHH", records.LEGACY_DEFINITION, len(kind_b), len(name_b)) + kind_b + name_b
                         + data_json.encode())


def test_records_of_the_first_format_are_still_read_and_a_snapshot_migrates_them(tmp_path):
    legacy = {
        "name": "old",
        "arguments": {
            "bin": {"__warren_bytes__": "AAE="}, "money": {"__warren_decimal__": "1.50"},
            "when": {"__warren_datetime__": "2024-01-02T03:04:05+00:00"},
            "hostile": {"__warren_decimal__": "nope"},  # the old encoder never wrote this: a client's table
        },
    }
    (tmp_path / "definitions.log").write_bytes(
        legacy_record("queue", "/|old", json.dumps(legacy)) + legacy_record("exchange", "/|gone", '{"name":"x"}')
        + legacy_record("exchange", "/|gone", "")
    )
    recovered = reopen(tmp_path)
    expected = {"name": "old", "arguments": {
        "bin": b"\x00\x01", "money": decimal.Decimal("1.50"),
        "when": datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc),
        "hostile": {"__warren_decimal__": "nope"},
    }}
    assert same(recovered.queues, [expected])
    assert recovered.exchanges == []
    assert (tmp_path / "format").read_text().strip() == str(CURRENT)

    table = DefinitionTable()
    payload = memoryview(legacy_record("queue", "/|old", json.dumps(legacy)))[records.FRAME_SIZE:]
    table.apply_recovered(records.LEGACY_DEFINITION, *records.decode_definition(payload), b"")
    snapshot = table.snapshot({}, 0)
    [(_, _, migrated)] = list(records.scan(snapshot))
    assert migrated[0] == records.DEFINITION
    assert same(decode_data(records.decode_definition(migrated)[2]), expected)


def test_a_definition_that_cannot_be_decoded_is_set_aside_and_the_rest_recovers(tmp_path, caplog):
    good = records.definition("queue", "/|before", encode_data({"name": "before"}))
    bad = records.definition("queue", "/|broken", b'{"m":{"arguments":{"b":"%%%"}}}')  # intact, but not ours
    after = records.definition("queue", "/|after", encode_data({"name": "after"}))
    (tmp_path / "definitions.log").write_bytes(good + bad + after)
    with caplog.at_level(logging.ERROR, logger="storage.recovery"):
        recovered = reopen(tmp_path)
    assert recovered.queues == [{"name": "before"}, {"name": "after"}]
    assert recovered.report["set_aside_records"] == 1
    assert recovered.set_aside_definitions == [("queue", "/|broken")]
    [line] = [record.getMessage() for record in caplog.records if record.levelno == logging.ERROR]
    assert f"offset {len(good)}" in line and "/|broken" in line and "definitions.log" in line
    assert (tmp_path / "quarantine" / f"definitions.log@{len(good)}").read_bytes() == bad

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="storage.recovery"):
        again = reopen(tmp_path)
    assert again.queues == [{"name": "before"}, {"name": "after"}]
    assert again.report["set_aside_records"] == 0 and not caplog.records


def test_the_issue_declare_no_longer_stops_the_next_start(tmp_path):
    """A queue argument {"__warren_decimal__": "nope"} made every later start exit with a traceback."""
    data = {"vhost": "/", "name": "q", "durable": True, "auto_delete": False,
            "arguments": {"x-foo": {"__warren_decimal__": "nope"}}}
    run(tmp_path, lambda store: store.append_definition("queue", "/|q", data))
    assert reopen(tmp_path).queues == [data]


def test_a_data_dir_of_a_newer_format_is_refused_with_a_clear_message(tmp_path):
    (tmp_path / "format").write_text(f"{CURRENT + 1}\n")
    with pytest.raises(UnsupportedFormat, match="newer Warren"):
        MessageStore(tmp_path).recover()
    (tmp_path / "format").write_text("garbage")
    with pytest.raises(UnsupportedFormat, match="format"):
        MessageStore(tmp_path).recover()


def test_a_new_data_dir_records_the_current_format(tmp_path):
    reopen(tmp_path)
    assert (tmp_path / "format").read_text().strip() == str(CURRENT)
