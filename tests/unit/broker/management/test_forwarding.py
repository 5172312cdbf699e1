"""Requests one management API forwards to another (broker.management.forwarding): the request it writes, the
answer it reads back, and the signature another node checks."""

import asyncio

from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from broker.management import http
from broker.management.forwarding import (
    GROUP, NODE_ITSELF, SIGNATURE, ApiClient, read_answer, signature, signed_by_another_node,
)

SECRET = "the cluster's secret"


def answer_to(raw: bytes, method: str = "GET"):
    async def read():
        reader = asyncio.StreamReader()
        reader.feed_data(raw)
        reader.feed_eof()
        return await read_answer(reader, method)
    return asyncio.run(read())


def test_an_interim_answer_is_not_taken_for_the_answer():
    answer = answer_to(b"HTTP/1.1 100 Continue\r\n\r\n"
                       b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\nContent-Type: application/json\r\n\r\n{}")
    assert (answer.status, answer.body, answer.headers["Content-Type"]) == (201, b"{}", "application/json")


def test_a_head_answer_keeps_the_length_its_get_would_have():
    answer = answer_to(b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n", method="HEAD")
    assert answer.body == b"" and answer.head_length == "1234"
    assert answer_to(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}").head_length is None


def client_request():
    return make_mocked_request("PUT", "/api/users/alice", headers=CIMultiDict(
        {"Host": "node-a.example:15672", "Origin": "http://node-a.example:15672", "Authorization": "Basic eA==",
         "Expect": "100-continue", "Content-Length": "2"}))


def test_the_clients_expect_is_answered_here_and_not_forwarded():
    head = ApiClient._head(client_request(), b"{}", None, False, "10.0.0.7").decode()
    assert "Expect" not in head and "Authorization: Basic eA==" in head and "Content-Length: 2" in head
    assert "X-Warren-Client: 10.0.0.7" in head
    assert "Host: node-a.example:15672" in head  # a worker of this node checks the same names


def test_another_node_gets_its_own_address_as_the_host_and_no_origin_this_node_checked_them():
    head = ApiClient._head(client_request(), b"{}", None, False, "10.0.0.7", ("10.0.0.2", 15672)).decode()
    assert "Host: 10.0.0.2:15672" in head and "node-a.example" not in head and "Origin:" not in head
    assert "Authorization: Basic eA==" in head and "X-Warren-Client: 10.0.0.7" in head
    head = ApiClient._head(client_request(), b"{}", None, False, "10.0.0.7", ("fd00::2", 15672, 0, 0)).decode()
    assert "Host: [fd00::2]:15672" in head


def signed(group, path="/api/queues", client="10.0.0.7", secret=SECRET, headers=None):
    sent = {GROUP: str(group), SIGNATURE: signature(secret, group, "GET", path, client, False),
            http.FORWARDED_CLIENT: client, **(headers or {})}
    return make_mocked_request("GET", path, headers=CIMultiDict(sent))


def test_a_request_signed_with_the_clusters_secret_names_its_group():
    assert signed_by_another_node(signed(1), SECRET) == 1
    assert signed_by_another_node(signed(NODE_ITSELF, "/api/nodes"), SECRET) == NODE_ITSELF


def test_a_request_not_signed_with_the_clusters_secret_is_not_taken():
    assert signed_by_another_node(signed(1, secret="another"), SECRET) is None
    assert signed_by_another_node(signed(1), "") is None  # this node has not learnt the secret yet
    # signed for another client, path or group than the one it names
    forged = signed(1, headers={http.FORWARDED_CLIENT: "10.0.0.8"})
    assert signed_by_another_node(forged, SECRET) is None
    moved = make_mocked_request("GET", "/api/users", headers=signed(1).headers)
    assert signed_by_another_node(moved, SECRET) is None
    regrouped = signed(1, headers={GROUP: "2"})
    assert signed_by_another_node(regrouped, SECRET) is None
