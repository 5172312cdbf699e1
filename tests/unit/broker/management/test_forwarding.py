"""Requests one management API forwards to another (broker.management.forwarding): the request it writes, the
answer it reads back, and the proofs each node checks."""

import asyncio
import time
import tracemalloc

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request
from multidict import CIMultiDict

from broker.management import forwarding, http
from protocol import node_proof
from broker.management.forwarding import (
    GROUP, NODE_ITSELF, NONCE, PROOF, ApiClient, address_text, from_other_nodes, read_answer,
)
from broker.management.server import take

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


CHUNKED = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n"
           b"2\r\n[1\r\n3\r\n,2]\r\n0\r\n\r\n")


def test_a_chunked_answer_is_read_whole_joined():
    answer = answer_to(CHUNKED)
    assert answer.body == b"[1,2]" and answer.json() == [1, 2] and answer.json_for_a_thread() == [1, 2]


def test_a_chunked_answer_is_passed_on_a_chunk_at_a_time_as_it_came():
    async def passed_on() -> tuple[bytes, str]:
        async def handle(request: web.Request) -> web.Response:
            return answer_to_pass.response()

        app = web.Application()
        app.router.add_get("/", handle)
        async with TestClient(TestServer(app)) as client:
            response = await client.get("/")
            return await response.read(), response.headers.get("Transfer-Encoding", "")

    answer_to_pass = answer_to(CHUNKED)
    assert answer_to_pass.parts == [b"[1", b",2]"]  # (not joined: 118 MB took the event loop 40 ms)
    assert asyncio.run(passed_on()) == (b"[1,2]", "chunked")


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
    assert "Content-Length: 34" in head  # the body, then its HMAC


def test_an_address_is_written_as_a_host_header_names_it():
    assert address_text(("10.0.0.2", 15672)) == "10.0.0.2:15672"
    assert address_text(("fd00::2", 15672, 0, 0)) == "[fd00::2]:15672"
    assert address_text(("::ffff:10.0.0.2", 15672, 0, 0)) == "10.0.0.2:15672"  # a dual-stack socket's IPv4 peer


class Recorder:
    """A TCP relay between a forwarding node and the node it asks, keeping what goes each way (what a listener on the
    network between them sees), that may change the bytes towards the asked node as they pass (alter)."""

    def __init__(self, port: int, alter=lambda data: data) -> None:
        self.port = port
        self.alter = alter
        self.sent = bytearray()  # towards the asked node, as the forwarding node sent it
        self.server = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _relay(self, reader, writer) -> None:
        upstream_reader, upstream = await asyncio.open_connection("127.0.0.1", self.port)

        async def pump(source, sink, kept=None, alter=lambda data: data) -> None:
            while data := await source.read(65536):
                if kept is not None:
                    kept += data
                sink.write(alter(data))
            sink.close()
        try:
            await asyncio.gather(pump(reader, upstream, self.sent, self.alter), pump(upstream_reader, writer),
                                 return_exceptions=True)
        except asyncio.CancelledError:  # (the test is over)
            pass


async def node_api(answer=None, secret=SECRET):
    """A node's API as other nodes reach it (the real listener), answering a proven request with answer(request,
    group), by default its group, what it asked and its body; its ManagementServer."""
    async def echo(request, group, _handler):
        try:
            body = await http.read_body(request) if request.body_exists else b""
        except http.ApiError as error:  # (as the API's rabbitmq_errors answers it)
            return error.response()
        return web.json_response({"group": group, "method": request.method, "path": request.path_qs,
                                  "client": request.headers[http.FORWARDED_CLIENT], "body": body.decode(),
                                  "authorization": request.headers.get("Authorization")})

    async def plain(request):
        return web.json_response({"not": "from another node"})

    app = web.Application(middlewares=[from_other_nodes(lambda: secret, answer or echo)])
    app[http.MAX_BODY_SIZE] = 1000
    app.router.add_route("*", "/{path:.*}", plain)
    return await take(app, "127.0.0.1", 0, "test API")


def client_request_to_forward(method="GET", body=None):
    headers = {"Host": "node-a.example", "Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="}
    if body is not None:
        headers |= {"Content-Length": str(len(body)), "Content-Type": "application/json"}
    return make_mocked_request(method, "/api/queues?x=1", headers=CIMultiDict(headers))


def forward(port, group=1, secret=SECRET, method="GET", body=None):
    return ApiClient(lambda: secret).ask_at(("127.0.0.1", port), group, client_request_to_forward(method, body),
                                            body, client="10.0.0.7")


def test_a_request_proven_with_the_clusters_secret_names_its_group_client_and_body():
    async def main():
        api = await node_api()
        await api.serve()
        try:
            answer = await forward(api.port, method="PUT", body=b'{"durable": true}')
            entries = await forward(api.port, NODE_ITSELF)
            return answer, entries
        finally:
            await api.stop()
    answer, entries = asyncio.run(main())
    assert (answer.status, answer.json()) == (200, {
        "group": 1, "method": "PUT", "path": "/api/queues?x=1", "client": "10.0.0.7", "body": '{"durable": true}',
        "authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
    assert entries.json()["group"] == NODE_ITSELF
    assert entries.json()["authorization"] is None  # an ask for a node's own entries needs no credentials


def test_nodes_that_do_not_share_the_secret_refuse_each_other():
    async def main():
        api = await node_api(secret="another")
        await api.serve()
        try:
            return await forward(api.port)
        finally:
            await api.stop()
    answer = asyncio.run(main())
    assert answer.status == 503
    assert "does not prove it knows the cluster's secret" in answer.json()["reason"] or "is starting" in \
        answer.json()["reason"]


def test_a_node_that_has_not_learnt_the_secret_answers_503():
    async def main():
        api = await node_api(secret="")
        await api.serve()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", api.port)
            writer.write(f"GET /api/x HTTP/1.1\r\nHost: a\r\n{NONCE}: {'ab' * 16}\r\n\r\n".encode())
            return await read_answer(reader, "GET")
        finally:
            await api.stop()
    answer = asyncio.run(main())
    assert (answer.status, answer.json()["reason"]) == (503, "this node has not learnt the cluster's secret yet")


def test_a_request_seen_on_the_wire_and_sent_again_is_refused_on_its_connection_and_on_another():
    async def main():
        api = await node_api()
        await api.serve()
        recorder = Recorder(api.port)
        try:
            answer = await forward(await recorder.start(), method="PUT", body=b'{"durable": true}')
            assert answer.status == 200
            captured = bytes(recorder.sent)  # the request for a challenge, then the proven request
            challenge_request, _, request = captured.partition(b"\r\n\r\n")
            again = []
            for sent in (captured, request):
                reader, writer = await asyncio.open_connection("127.0.0.1", api.port)
                writer.write(sent)
                first = await read_answer(reader, "GET")
                again.append(first if first.status != 204 else await read_answer(reader, "GET"))
                writer.close()
            return again
        finally:
            await api.stop()
    for answer in asyncio.run(main()):
        assert answer.status == 403, answer.body
        assert "proof of the cluster's secret" in answer.json()["reason"]


def test_a_challenge_proves_one_request():
    async def main():
        api = await node_api()
        await api.serve()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", api.port)
            asked = node_proof.nonce()
            writer.write(f"GET /api/x HTTP/1.1\r\nHost: a\r\n{NONCE}: {asked.hex()}\r\n\r\n".encode())
            key = node_proof.link_key(SECRET, forwarding.LINK)
            answered = node_proof.read_challenge(key, asked, bytes.fromhex(
                (await read_answer(reader, "GET")).headers[forwarding.CHALLENGE]))
            proof = forwarding.request_proof(key, asked, answered, 1, "GET", "/api/queues", "127.0.0.1", False, "",
                                             False)
            request = (f"GET /api/queues HTTP/1.1\r\nHost: a\r\n{GROUP}: 1\r\n{PROOF}: {proof.hex()}\r\n"
                       f"{http.FORWARDED_CLIENT}: 127.0.0.1\r\n\r\n").encode()
            writer.write(request + request)  # kept alive: the same request twice on the connection
            return await read_answer(reader, "GET"), await read_answer(reader, "GET")
        finally:
            await api.stop()
    first, second = asyncio.run(main())
    assert first.status == 200 and first.json()["client"] == "127.0.0.1"
    assert second.status == 403


def test_a_node_keeps_nothing_of_the_requests_other_nodes_forward():
    """Nothing a forwarded request leaves on the node it reaches outlives its connection: a follower that forwards
    every request of a client without credentials fills no table there (a table of requests seen would refuse
    everyone once full)."""
    async def main():
        api = await node_api()
        await api.serve()
        try:
            await forward(api.port)  # (whatever is made once, on a first request)
            tracemalloc.start()
            before = tracemalloc.take_snapshot()
            for _ in range(500):
                assert (await forward(api.port)).status == 200
            after = tracemalloc.take_snapshot()
            tracemalloc.stop()
        finally:
            await api.stop()
        kept = after.filter_traces([tracemalloc.Filter(True, forwarding.__file__)]).compare_to(
            before.filter_traces([tracemalloc.Filter(True, forwarding.__file__)]), "filename")
        return sum(stat.size_diff for stat in kept)
    assert asyncio.run(main()) < 8 * 1024  # (a table of the requests seen: about 100 bytes each, 49 KB here)


def test_headers_that_are_not_utf_8_are_proven_as_they_came():
    """A client's credentials (or a client's address) in bytes that are not UTF-8: proven and taken as sent, and a
    forged request with such bytes is refused, neither answered with a traceback."""
    async def main():
        api = await node_api()
        await api.serve()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", api.port)
            asked = node_proof.nonce()
            writer.write(f"GET /api/x HTTP/1.1\r\nHost: a\r\n{NONCE}: {asked.hex()}\r\n\r\n".encode())
            key = node_proof.link_key(SECRET, forwarding.LINK)
            answered = node_proof.read_challenge(key, asked, bytes.fromhex(
                (await read_answer(reader, "GET")).headers[forwarding.CHALLENGE]))
            authorization = "Basic \udcff\udcfe"  # the bytes ff fe, as a header's text holds them
            proof = forwarding.request_proof(key, asked, answered, 1, "GET", "/api/q", "127.0.0.1", False,
                                             authorization, False)
            head = (f"GET /api/q HTTP/1.1\r\nHost: a\r\n{GROUP}: 1\r\n{PROOF}: {proof.hex()}\r\n"
                    f"{http.FORWARDED_CLIENT}: 127.0.0.1\r\nAuthorization: ").encode() + b"Basic \xff\xfe\r\n\r\n"
            writer.write(head)
            taken = await read_answer(reader, "GET")
            reader, writer = await asyncio.open_connection("127.0.0.1", api.port)  # a forged one, as the attacker
            writer.write(f"GET /api/x HTTP/1.1\r\nHost: a\r\n{NONCE}: {asked.hex()}\r\n\r\n".encode())
            await read_answer(reader, "GET")
            writer.write(head.replace(proof.hex().encode(), b"00" * 32).replace(b"127.0.0.1", b"\xff"))
            forged = await read_answer(reader, "GET")
            return taken, forged
        finally:
            await api.stop()
    taken, forged = asyncio.run(main())
    assert taken.status == 200 and taken.json()["authorization"] == "Basic \udcff\udcfe"
    assert forged.status == 403


def test_an_empty_body_sent_in_chunks_is_forwarded_as_one():
    async def main():
        api = await node_api()
        await api.serve()
        try:
            async def nothing():
                return
                yield b""
            request = make_mocked_request("PUT", "/api/queues?x=1", headers=CIMultiDict(
                {"Host": "a", "Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q=", "Transfer-Encoding": "chunked"}))
            return await ApiClient(lambda: SECRET).ask_at(("127.0.0.1", api.port), 1, request, nothing(),
                                                          client="10.0.0.7")
        finally:
            await api.stop()
    answer = asyncio.run(main())
    assert (answer.status, answer.json()["body"]) == (200, "")


@pytest.mark.parametrize("challenge_answer", [
    b"HTTP/1.1\r\n\r\n",  # no status
    b"HTTP/1.1 204 No Content\r\nX-Padding: " + b"x" * 100_000 + b"\r\n\r\n",  # past the reader's limit
    b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\n",  # a body it would read, from whom?
    b"HTTP/1.1 204 No Content\r\nX-Warren-Challenge: zz\r\n\r\n",
], ids=["no-status", "huge-head", "huge-body", "bad-challenge"])
def test_what_answers_a_request_for_a_challenge_unlike_a_node_is_503(challenge_answer):
    async def main():
        async def impostor(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(challenge_answer)
            await reader.read()

        server = await asyncio.start_server(impostor, "127.0.0.1", 0)
        try:
            return await forward(server.sockets[0].getsockname()[1])
        finally:
            server.close()
    answer = asyncio.run(asyncio.wait_for(main(), 10))
    assert answer.status == 503


def test_a_body_changed_on_the_way_is_refused():
    async def main():
        api = await node_api()
        await api.serve()
        recorder = Recorder(api.port, alter=lambda data: data.replace(b'"durable": true', b'"durable": fals'))
        try:
            return await forward(await recorder.start(), method="PUT", body=b'{"durable": true}')
        finally:
            await api.stop()
    answer = asyncio.run(main())
    assert (answer.status, answer.json()["reason"]) == (
        403, "the body of a request from another node is not the one it sent")


def test_a_client_may_not_pass_for_another_node():
    async def main():
        api = await node_api()
        await api.serve()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", api.port)
            writer.write(f"GET /api/queues HTTP/1.1\r\nHost: a\r\n{GROUP}: 1\r\n{PROOF}: {'00' * 32}\r\n"
                         f"{http.FORWARDED_CLIENT}: 127.0.0.1\r\n\r\n".encode())
            return await read_answer(reader, "GET")
        finally:
            await api.stop()
    assert asyncio.run(main()).status == 403


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
