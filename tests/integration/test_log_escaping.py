"""Names chosen by clients and operators reach the log escaped: a vhost, queue or user name holding a line break
or a NUL can neither split a log line nor forge one, in the text format and in the JSON one."""

from __future__ import annotations

import json

import pika
import pika.exceptions
import pytest

from tests.integration.helpers import connect
from tests.integration.management import quote, request
from tests.integration.test_operator_logs import logged

FORGED = "INFO broker.model.node: user admin added"  # what a name could write as a line of its own
HOSTILE = f"ops\r\n{FORGED}\x00end"
ESCAPED = repr(HOSTILE)  # 'ops\r\nINFO ... added\x00end', on one line


def assert_one_line_per_event(log: str) -> None:
    assert "\r" not in log and "\x00" not in log
    assert not any(line.startswith(FORGED) for line in log.splitlines())


def test_a_vhost_named_with_line_breaks_and_nul_is_logged_escaped_when_recovered(own_broker):
    broker = own_broker()
    assert request(broker, "PUT", f"/api/vhosts/{quote(HOSTILE)}").status in (201, 204)
    assert request(broker, "PUT", f"/api/permissions/{quote(HOSTILE)}/guest",
                   {"configure": ".*", "write": ".*", "read": ".*"}).status in (201, 204)
    parameters = pika.ConnectionParameters(broker.host, broker.port, HOSTILE)
    with pika.BlockingConnection(parameters) as conn:
        conn.channel().queue_declare("kept", durable=True)
    broker.restart()
    line = logged(broker, f"vhost {ESCAPED}: ")
    assert line.endswith("1 queues, 0 bindings, 0 messages restored")
    assert_one_line_per_event(broker.log())


def test_a_queue_name_in_a_closing_reply_is_logged_escaped(own_broker):
    broker = own_broker()
    with connect(broker) as conn:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker):
            conn.channel().queue_declare(HOSTILE, passive=True)
    line = logged(broker, "channel error on connection")
    assert f"no queue {ESCAPED} in vhost '/'" in line
    assert_one_line_per_event(broker.log())


def test_json_log_lines_hold_the_name_as_it_is_on_one_line(own_broker):
    broker = own_broker("--log-format", "json")
    name = HOSTILE + "\u2028\x85"  # separators json.dumps leaves as they are, which str.splitlines() splits on
    with connect(broker) as conn:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker):
            conn.channel().queue_declare(name, passive=True)
    line = logged(broker, "channel error on connection")
    assert f"no queue '{name}' in vhost '/'" in json.loads(line)["message"]
    log = broker.log()
    assert "\u2028" not in log and "\x85" not in log
    assert_one_line_per_event(log)
