"""Fixtures of the MQTT tests."""

from __future__ import annotations

import itertools
import os

import pytest

_numbers = itertools.count()


@pytest.fixture
def unique():
    """A prefix for client ids and topics unique to the test: letters, digits and "-" alone (no wildcard)."""
    return f"t{os.getpid()}-{next(_numbers)}-{os.urandom(3).hex()}"
