"""How the supervisor's management API talks to a worker's (broker.workers.api): the request it writes, and the
answer it reads back."""

import asyncio
import json
from types import SimpleNamespace

from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from broker.management import http
from broker.workers.api import Answer, Gateway, WorkerApis, read_answer, unavailable


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


def test_the_clients_expect_is_answered_here_and_not_forwarded():
    request = make_mocked_request("PUT", "/api/users/alice", headers=CIMultiDict(
        {"Host": "h", "Authorization": "Basic eA==", "Expect": "100-continue", "Content-Length": "2"}))
    head = WorkerApis._head(request, b"{}", None, False, "10.0.0.7").decode()
    assert "Expect" not in head and "Authorization: Basic eA==" in head and "Content-Length: 2" in head
    assert "X-Warren-Client: 10.0.0.7" in head


def test_a_worker_that_does_not_answer_is_listed_as_a_node_not_running():
    supervisor = SimpleNamespace(config=SimpleNamespace(management_tls=False, cluster_node_id="a"), clustered=True,
                                 workers=[object(), object()])
    answers = [Answer(200, CIMultiDict(), json.dumps([{"name": "a-0@h", "running": True}]).encode()),
               unavailable("worker 1", make_mocked_request("GET", "/api/nodes"), ConnectionRefusedError())]
    assert Gateway(supervisor).entries(answers) == [
        {"name": "a-0@h", "running": True}, {"name": f"a-1@{http.host_name()}", "type": "disc", "running": False}]
