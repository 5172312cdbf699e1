"""Fixtures of the integration tests (the broker fixtures are in tests/conftest.py)."""

import pytest

from tests.integration.helpers import connect, open_channel


@pytest.fixture
def channel(broker):
    """A channel of a connection of its own, for one test."""
    with open_channel(broker) as opened:
        yield opened


@pytest.fixture
def conn(broker):
    """A connection of its own, for one test."""
    with connect(broker) as opened:
        yield opened
