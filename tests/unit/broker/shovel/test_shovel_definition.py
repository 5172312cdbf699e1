"""A shovel's definition as RabbitMQ checks it (rabbit_shovel_parameters, rabbit_amqp091_shovel): keys, old names,
defaults and the texts of its refusals; AMQP URIs as its URI spec reads them."""

from __future__ import annotations

import pytest

from broker.links.validation import DefinitionError
from broker.shovel.definition import checked
from broker.links.uri import UriError, parse, without_credentials

BASE = {"src-uri": "amqp://h", "dest-uri": "amqp://h", "src-queue": "q"}


def reasons(value: dict) -> list[str]:
    with pytest.raises(DefinitionError) as refused:
        checked("/", "s", value)
    assert str(refused.value) == "Validation failed\n\n" + "".join(f"{reason}\n" for reason in refused.value.reasons)
    return refused.value.reasons


def test_the_defaults_are_rabbitmqs():
    shovel = checked("/", "s", BASE)
    assert (shovel.ack_mode, shovel.reconnect_delay, shovel.prefetch, shovel.delete_after) == (
        "on-confirm", 5, 1000, "never")
    assert (shovel.add_forward_headers, shovel.add_timestamp_header, shovel.publish_properties) == (False, False, {})
    assert (shovel.source.queue, shovel.source.predeclared, shovel.destination.queue) == ("q", False, None)


def test_an_empty_list_is_taken_for_an_empty_table_as_rabbitmq_takes_an_empty_proplist():
    shovel = checked("/", "s", {**BASE, "dest-publish-properties": [], "src-queue-args": [], "src-consumer-args": []})
    assert (shovel.publish_properties, shovel.source.queue_args, shovel.consumer_args) == ({}, {}, {})


def test_the_old_names_count_and_the_prefixed_ones_win():
    shovel = checked("/", "s", {**BASE, "prefetch-count": 5, "delete-after": 7, "add-forward-headers": True,
                                "publish-properties": {"delivery_mode": 2}})
    assert (shovel.prefetch, shovel.delete_after, shovel.add_forward_headers, shovel.publish_properties) == (
        5, 7, True, {"delivery_mode": 2})
    shovel = checked("/", "s", {**BASE, "prefetch-count": 5, "src-prefetch-count": 9})
    assert shovel.prefetch == 9


@pytest.mark.parametrize("value, expected", [
    ({"src-uri": "amqp://h", "dest-uri": "amqp://h"}, ["Must specify 'src-exchange' or 'src-queue'"]),
    ({**BASE, "src-exchange": "x"}, ["Cannot specify 'src-exchange' and 'src-queue'"]),
    ({**BASE, "dest-exchange": "x", "dest-queue": "y"}, ["Cannot specify 'dest-exchange' and 'dest-queue'"]),
    ({**BASE, "ack-mode": "no-ack", "src-delete-after": 5}, ["Cannot specify 'no-ack' and numerical 'delete-after'"]),
    ({"src-queue": "q"}, ['Key "dest-uri" not found in s', 'Key "src-uri" not found in s']),  # (last check first)
    ({**BASE, "bogus": 1}, ['Unrecognised terms [{<<"bogus">>,1}] in s']),
    ({**BASE, "ack-mode": "x"},
     ['ack-mode should be one of [<<"no-ack">>,<<"on-publish">>,<<"on-confirm">>], actually was <<"x">>']),
    ({**BASE, "reconnect-delay": "soon"}, ['reconnect-delay should be a number, actually was <<"soon">>']),
    ({**BASE, "src-predeclared": "yes"}, ['src-predeclared should be boolean, actually was <<"yes">>']),
    ({**BASE, "src-delete-after": "later"},
     ['src-delete-after should be a number greater than or equal to 0, "never" or "queue-length", actually was '
      '<<"later">>']),
    ({**BASE, "dest-queue": "q" * 256}, [f'dest-queue should be less than 255 bytes, actually was <<"{"q" * 256}">>']),
    ({**BASE, "dest-publish-properties": {"headers": {}}}, ['Unrecognised terms [{<<"headers">>,#{}}] in '
                                                            'dest-publish-properties']),
    ({**BASE, "src-protocol": "amqp10"}, ["src-protocol: Warren's shovels speak amqp091 only, not amqp10"]),
])
def test_a_definition_rabbitmq_refuses_is_refused_with_its_texts(value, expected):
    assert reasons(value) == expected


def test_a_uri_that_names_no_broker_is_refused_saying_why():
    assert reasons({**BASE, "dest-uri": "derp"}) == [
        "\"derp\" not a valid URI: the scheme must be amqp or amqps, not ''"]
    assert reasons({**BASE, "dest-uri": "amqp://:5672"}) == [
        '"amqp://:5672" not a valid URI: a port or amqps needs a host (amqp:// alone names this node)']
    assert reasons({**BASE, "dest-uri": ["amqp://h", 3]}) == [
        'dest-uri should be list, actually was [<<"amqp://h">>,3]']


def test_uris_are_read_as_rabbitmqs_uri_spec_reads_them():
    address = parse("amqps://user%40x:p%3Aw@host:7000/a%2Fb?heartbeat=5&connection_timeout=2500&verify=verify_none")
    assert (address.host, address.port, address.vhost, address.user, address.password, address.tls,
            address.heartbeat, address.connection_timeout, address.verify) == (
        "host", 7000, "a/b", "user@x", "p:w", True, 5, 2.5, False)
    plain = parse("amqp://host")
    assert (plain.port, plain.vhost, plain.user, plain.password, plain.heartbeat) == (5672, "/", "guest", "guest", 60)
    assert parse("amqp://host/").vhost == ""
    local = parse("amqp://")
    assert (local.local, local.vhost, local.user, local.password) == (True, "/", "guest", "guest")
    assert (parse("amqp://u:p@/v").local, parse("amqp://u:p@/v").user, parse("amqp://u:p@/v").vhost) == (True, "u", "v")
    with pytest.raises(UriError, match="unknown query parameters"):
        parse("amqp://host?nope=1")


def test_a_uri_is_shown_without_its_credentials_or_query():
    assert without_credentials("amqp://guest:secret@host:5672/%2f?heartbeat=5") == "amqp://host:5672/%2f"
    assert without_credentials("amqp://u:p@host") == "amqp://host"
