"""Robustness tests: adversarial clients, damaged data dirs, failing disks. Each is bounded in count and time and
sends traffic only to brokers it starts on 127.0.0.1 (the broker fixtures are in tests/conftest.py)."""
