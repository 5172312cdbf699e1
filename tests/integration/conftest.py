"""Fixtures of the integration tests (the broker fixtures are in tests/conftest.py)."""

import pytest

from tests.integration.helpers import open_channel


@pytest.fixture
def channel(broker):
    """A channel of a connection of its own, for one test."""
    with open_channel(broker) as opened:
        yield opened
