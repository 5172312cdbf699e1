"""The management API's 401s as RabbitMQ 3.10 gives them: credentials absent or wrong are "not_authorized" with a
Basic challenge (rabbit_mgmt_util:not_authenticated); right credentials that may not do the call are
"not_authorised" without one (rabbit_mgmt_util:not_authorised)."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import pytest

from tests.integration.management import add_user, delete_user

CHALLENGE = 'Basic realm="RabbitMQ Management"'
LOGIN_FAILED = {"error": "not_authorized", "reason": "Login failed"}


def refusal(broker, path: str, credentials: str | None) -> tuple[int, object, str | None]:
    """(status, decoded body or None, WWW-Authenticate or None) of a GET that is expected to fail."""
    headers = {}
    if credentials is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(credentials.encode()).decode()
    call = urllib.request.Request(broker.management_url + path, headers=headers)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(call, timeout=10)
    raw = refused.value.read()
    return refused.value.code, json.loads(raw) if raw else None, refused.value.headers.get("WWW-Authenticate")


@pytest.fixture
def users(broker, unique):
    """A user without tags and one with management only, both with password pw."""
    tagless, manager = f"{unique}-tagless", f"{unique}-manager"
    add_user(broker, tagless, "pw", "")
    add_user(broker, manager, "pw", "management")
    yield tagless, manager
    delete_user(broker, tagless)
    delete_user(broker, manager)


def test_absent_or_wrong_credentials_are_not_authorized_with_a_challenge(broker, users):
    tagless, _ = users
    assert refusal(broker, "/api/overview", None) == (401, None, CHALLENGE)
    assert refusal(broker, "/api/overview", "guest:wrong") == (401, LOGIN_FAILED, CHALLENGE)
    assert refusal(broker, "/api/overview", f"{tagless}-nobody:pw") == (401, LOGIN_FAILED, CHALLENGE)
    assert refusal(broker, "/api/overview", f"{tagless}:wrong") == (401, LOGIN_FAILED, CHALLENGE)


def test_right_credentials_that_may_not_do_the_call_are_not_authorised_without_a_challenge(broker, users):
    tagless, manager = users
    assert refusal(broker, "/api/overview", f"{tagless}:pw") == (
        401, {"error": "not_authorised", "reason": "Not management user"}, None)
    assert refusal(broker, "/api/users", f"{manager}:pw") == (
        401, {"error": "not_authorised", "reason": "Not administrator user"}, None)
    assert refusal(broker, "/api/queues/%2F", f"{manager}:pw") == (
        401, {"error": "not_authorised", "reason": "User not authorised to access virtual host"}, None)
