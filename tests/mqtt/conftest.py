"""Fixtures of the MQTT tests."""

from __future__ import annotations

import itertools
import os

import pytest

collect_ignore = ["paho_interop"]  # Eclipse Paho's tests, vendored: tests/mqtt/test_paho_interop.py runs them

_numbers = itertools.count()


@pytest.fixture
def unique():
    """A prefix for client ids and topics unique to the test: letters, digits and "-" alone (no wildcard)."""
    return f"t{os.getpid()}-{next(_numbers)}-{os.urandom(3).hex()}"
