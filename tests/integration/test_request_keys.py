"""The management API keeps what it stores on a request under web.RequestKey keys: aiohttp 3.14 warns
(NotAppKeyWarning) at every request that stores a value under a plain string, as the API once did with its user."""

from __future__ import annotations

from tests.integration.management import request


def test_no_request_of_the_api_stores_under_a_string_key(own_broker, monkeypatch):
    # the broker's process turns the warning (NotAppKeyWarning's text) into an error, which the API answers with a 500
    monkeypatch.setenv("PYTHONWARNINGS", "error:It is recommended to use web.RequestKey")
    broker = own_broker()
    assert request(broker, "GET", "/api/whoami") == (200, {"name": "guest", "tags": ["administrator"]})
    assert request(broker, "GET", "/api/overview").status == 200
    assert request(broker, "GET", "/api/whoami", password="wrong").status == 401
