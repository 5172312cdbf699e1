"""The supervisor's management API (broker.workers.api): what it makes of its workers' answers (the requests it
writes and the answers it reads: tests/unit/broker/management/test_forwarding.py)."""

import json
from types import SimpleNamespace

from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from broker.management import http
from broker.management.forwarding import Answer, unavailable
from broker.workers.api import Gateway


def test_a_worker_that_does_not_answer_is_listed_as_a_node_not_running():
    supervisor = SimpleNamespace(config=SimpleNamespace(management_tls=False, cluster_node_id="a"), clustered=True,
                                 workers=[object(), object()])
    answers = [Answer(200, CIMultiDict(), json.dumps([{"name": "a-0@h", "running": True}]).encode()),
               unavailable("worker 1", make_mocked_request("GET", "/api/nodes"), ConnectionRefusedError())]
    assert Gateway(supervisor).entries(answers) == [
        {"name": "a-0@h", "running": True}, {"name": f"a-1@{http.host_name()}", "type": "disc", "running": False}]
