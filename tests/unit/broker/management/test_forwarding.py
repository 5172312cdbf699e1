"""Requests one management API forwards to another (broker.management.forwarding): the request it writes, the
answer it reads back, and the signature another node checks."""

import asyncio
import time

from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from broker.management import forwarding, http
from broker.management.forwarding import (
    GROUP, NODE_ITSELF, SIGNATURE, SIGNED, SIGNED_FOR, ApiClient, SeenSignatures, address_text, read_answer,
    signature, signed_by_another_node,
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
    head = ApiClient._head(client_request(), "PUT", b"{}", "/api/users/alice", False, "10.0.0.7").decode()
    assert "Expect" not in head and "Authorization: Basic eA==" in head and "Content-Length: 2" in head
    assert "X-Warren-Client: 10.0.0.7" in head
    assert "Host: node-a.example:15672" in head  # a worker of this node checks the same names


def test_another_node_gets_its_own_address_as_the_host_and_no_origin_this_node_checked_them():
    head = ApiClient._head(client_request(), "PUT", b"{}", "/api/users/alice", False, "10.0.0.7",
                           "10.0.0.2:15672").decode()
    assert "Host: 10.0.0.2:15672" in head and "node-a.example" not in head and "Origin:" not in head
    assert "Authorization: Basic eA==" in head and "X-Warren-Client: 10.0.0.7" in head


def test_an_address_is_written_as_a_host_header_names_it():
    assert address_text(("10.0.0.2", 15672)) == "10.0.0.2:15672"
    assert address_text(("fd00::2", 15672, 0, 0)) == "[fd00::2]:15672"
    assert address_text(("::ffff:10.0.0.2", 15672, 0, 0)) == "10.0.0.2:15672"  # a dual-stack socket's IPv4 peer


HERE = ("10.0.0.2", 15672)  # the address of the socket the requests below came in on


class Transport:
    """What signed_by_another_node asks of a request's transport: the address it came in on."""

    def __init__(self, sockname: tuple = HERE) -> None:
        self.sockname = sockname

    def get_extra_info(self, name: str):
        return self.sockname if name == "sockname" else None


def signed(group, path="/api/queues", client="10.0.0.7", secret=SECRET, at=None, nonce="0123456789abcdef",
           authorization="Basic Z3Vlc3Q6Z3Vlc3Q=", to="10.0.0.2:15672", headers=None, sockname=HERE):
    """A request as another node signs it (at: the time it was signed, now unless given; to: where it sent it),
    come in on a socket at sockname."""
    stamp = f"{int(time.time() if at is None else at)}.{nonce}"
    sent = {GROUP: str(group), SIGNED: stamp, "Authorization": authorization, http.FORWARDED_CLIENT: client,
            SIGNATURE: signature(secret, group, "GET", path, client, False, stamp, authorization, to),
            **(headers or {})}
    return make_mocked_request("GET", path, headers=CIMultiDict(sent), transport=Transport(sockname))


def test_a_request_signed_with_the_clusters_secret_names_its_group():
    assert signed_by_another_node(signed(1), SECRET, SeenSignatures()) == 1
    assert signed_by_another_node(signed(NODE_ITSELF, "/api/nodes"), SECRET, SeenSignatures()) == NODE_ITSELF
    dual_stack = signed(1, sockname=("::ffff:10.0.0.2", 15672, 0, 0))  # (the sender saw the IPv4 address)
    assert signed_by_another_node(dual_stack, SECRET, SeenSignatures()) == 1


def test_a_request_not_signed_with_the_clusters_secret_is_not_taken():
    def taken(request, secret=SECRET):
        return signed_by_another_node(request, secret, SeenSignatures()) is not None

    assert not taken(signed(1, secret="another"))
    assert not taken(signed(1), "")  # this node has not learnt the secret yet
    # signed for another client, path, group, time, credentials or node than the ones it names or comes to
    assert not taken(signed(1, headers={http.FORWARDED_CLIENT: "10.0.0.8"}))
    assert not taken(make_mocked_request("GET", "/api/users", headers=signed(1).headers, transport=Transport()))
    assert not taken(signed(1, headers={GROUP: "2"}))
    assert not taken(signed(1, headers={SIGNED: f"{int(time.time()) + 1}.0123456789abcdef"}))
    assert not taken(signed(1, headers={"Authorization": "Basic YWRtaW46YWRtaW4="}))  # admin:admin
    assert not taken(signed(1, to="10.0.0.3:15672"))  # sent to another node, sent again here
    assert not taken(signed(1, sockname=("10.0.0.2", 15673)))


def test_a_stamp_that_is_not_seconds_and_random_hex_is_not_taken_however_signed():
    for stamp in ("nan.0123456789abcdef", "inf.0123456789abcdef", "1e9.0123456789abcdef", "soon",
                  f"{int(time.time())}.0123", f"{int(time.time())}.0123456789ABCDEF", f"{int(time.time())}"):
        authorization = "Basic Z3Vlc3Q6Z3Vlc3Q="
        request = make_mocked_request("GET", "/api/queues", transport=Transport(), headers=CIMultiDict({
            GROUP: "1", SIGNED: stamp, "Authorization": authorization, http.FORWARDED_CLIENT: "10.0.0.7",
            SIGNATURE: signature(SECRET, 1, "GET", "/api/queues", "10.0.0.7", False, stamp, authorization,
                                 "10.0.0.2:15672")}))
        assert signed_by_another_node(request, SECRET, SeenSignatures()) is None, stamp


def test_a_signature_is_taken_once_and_within_its_time():
    seen = SeenSignatures()
    request = signed(1)
    assert signed_by_another_node(request, SECRET, seen) == 1
    assert signed_by_another_node(request, SECRET, seen) is None  # the same request sent again
    assert signed_by_another_node(signed(1, nonce="fedcba9876543210"), SECRET, seen) == 1  # another request
    now = time.time()
    assert signed_by_another_node(signed(1, at=now - SIGNED_FOR + 5, nonce="a" * 16), SECRET, seen) == 1
    assert signed_by_another_node(signed(1, at=now - SIGNED_FOR - 5, nonce="b" * 16), SECRET, seen) is None
    assert signed_by_another_node(signed(1, at=now + SIGNED_FOR + 5, nonce="c" * 16), SECRET, seen) is None


def test_signatures_are_forgotten_once_their_time_is_past_and_kept_to_a_limit():
    seen = SeenSignatures(limit=2)
    now = time.time()
    assert seen.take("old", now - 1, now) == "new"
    assert seen.take("kept", now + 60, now) == "new"
    assert seen.take("another", now + 30, now) == "new"  # ("old" is forgotten first)
    assert seen.seen == {"kept", "another"}
    assert seen.take("kept", now + 60, now) == "again"
    assert seen.take("one more", now + 60, now) == "full"  # taken again once others expire
    assert seen.take("one more", now + 60, now + 31) == "new"


def asked(handler, group, method=None):
    """What an ApiClient gets from a node whose API answers with handler, asked for group (a GET of
    /api/queues?x=1 with guest's credentials, from 10.0.0.7)."""
    async def ask():
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        request = make_mocked_request("GET", "/api/queues?x=1", headers=CIMultiDict(
            {"Host": "node-a.example", "Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="}))
        try:
            return await ApiClient(lambda: SECRET).ask_at(("127.0.0.1", port), group, request, client="10.0.0.7",
                                                          method=method)
        finally:
            await runner.cleanup()
    return asyncio.run(ask())


def test_what_an_api_client_signs_the_other_node_takes():
    async def check(request):
        group = signed_by_another_node(request, SECRET, SeenSignatures())
        return web.json_response({"group": group, "method": request.method, "path": request.path_qs,
                                  "client": request.headers[http.FORWARDED_CLIENT]})

    answer = asked(check, 1)
    assert (answer.status, answer.json()) == (200, {"group": 1, "method": "GET", "path": "/api/queues?x=1",
                                                     "client": "10.0.0.7"})
    assert asked(check, NODE_ITSELF, method="POST").json()["method"] == "POST"


def test_a_node_that_does_not_answer_in_time_is_a_504_that_says_the_request_may_have_been_applied(monkeypatch):
    monkeypatch.setattr(forwarding, "ENTRY_TIMEOUT", 0.2)

    async def ask():
        done = asyncio.Event()

        async def silent(reader, writer):
            await done.wait()  # reads nothing, answers nothing
            writer.close()

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        request = make_mocked_request("GET", "/api/nodes")
        try:
            return await ApiClient(lambda: SECRET).ask_at(("127.0.0.1", port), NODE_ITSELF, request), port
        finally:
            done.set()
            server.close()
            await server.wait_closed()

    started = time.monotonic()
    answer, port = asyncio.run(ask())
    assert answer.status == 504 and time.monotonic() - started < 5
    assert answer.json() == {"error": "gateway_timeout", "reason": f"the node at 127.0.0.1:{port} did not answer "
                                                                    "within 0.2 s; the request may have been applied"}
