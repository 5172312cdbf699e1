"""Runs one test case of Eclipse Paho's interoperability tests (tests/mqtt/paho_interop) against a broker:
``python -m tests.mqtt.paho_runner LEVEL PORT TEST`` (LEVEL 4: client_test.py, MQTT 3.1.1; 5: client_test5.py).
The vendored files stay as they came: their settings, which their own command line would set, are set here."""

from __future__ import annotations

import logging
import sys
import unittest
from pathlib import Path

INTEROPERABILITY = Path(__file__).resolve().parent / "paho_interop" / "interoperability"


def main(level: str, port: str, test: str) -> int:
    sys.path.insert(0, str(INTEROPERABILITY))
    module = __import__("client_test" if level == "4" else "client_test5")
    module.host, module.port = "127.0.0.1", int(port)
    module.topics = ("TopicA", "TopicA/B", "Topic/C", "TopicA/C", "/TopicA")
    module.wildtopics = ("TopicA/+", "+/C", "#", "/#", "/+", "+/+", "TopicA/#")
    module.nosubscribe_topics = ("test/nosubscribe",)
    module.topic_prefix = "client_test5/"
    logging.getLogger().setLevel(logging.ERROR)
    suite = unittest.defaultTestLoader.loadTestsFromName(f"Test.{test}", module)
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
