"""Fixtures of the integration tests (the broker fixtures are in tests/conftest.py)."""

import shutil
import tempfile
from pathlib import Path

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


@pytest.fixture
def short_temporary():
    """A temporary directory of a short path, removed after the test: a socket's path in it holds 107 bytes at most,
    which one in tmp_path can pass under pytest-xdist."""
    temporary = Path(tempfile.mkdtemp(prefix="w"))
    yield temporary
    shutil.rmtree(temporary, ignore_errors=True)
