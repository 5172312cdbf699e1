"""AMQP over TLS against plain AMQP on the same Warren, with the split publisher -> queue -> consumer runs
(separate processes, alternating plain and TLS: P T T P), and the broker's CPU per message for each.

    python -m tests.bench.tls [--seconds 5] [--scenario pubsub --scenario pubsub-1k]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.bench.brokers import RunningBroker, start_warren
from tests.bench.compare import RUNS_BY_NAME, run_split
from tests.conftest import free_port
from tests.tls_certs import make_certificates


@dataclass
class TlsBroker(RunningBroker):
    """The same broker, reached on its amqps port."""

    @property
    def url(self) -> str:
        return f"amqps://guest:guest@127.0.0.1:{self.port}/%2F"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.tls", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--scenario", action="append", choices=["pubsub", "pubsub-ack", "pubsub-1k", "pubsub-ack-1k"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="warren-tls-") as work:
        workdir = Path(work)
        certificates = make_certificates(workdir / "certs")
        config = workdir / "warren.toml"
        config.write_text(f'[tls]\ncertfile = "{certificates.path("server.pem")}"\n'
                          f'keyfile = "{certificates.path("server.key")}"\n')
        tls_port = free_port()
        plain = start_warren(workdir, "--config", str(config), "--tls-port", str(tls_port))
        over_tls = TlsBroker(plain.name, tls_port, plain.process, plain.pid)
        try:
            print(f"{'scenario':16} {'plain msg/s':>12} {'TLS msg/s':>12} {'TLS/plain':>10} "
                  f"{'plain µs/msg':>13} {'TLS µs/msg':>11}")
            for name in args.scenario or ["pubsub", "pubsub-1k"]:
                results: dict[str, list[dict]] = {"plain": [], "tls": []}
                for side in ("plain", "tls", "tls", "plain"):
                    figures = run_split(plain if side == "plain" else over_tls, RUNS_BY_NAME[name], args.seconds)
                    if isinstance(figures, str):
                        raise SystemExit(f"{name} over {side}: {figures}")
                    results[side].append(figures)
                rate = {side: statistics.mean(f["msg/s"] for f in runs) for side, runs in results.items()}
                cpu = {side: statistics.mean(f["cpu us/msg"] for f in runs) for side, runs in results.items()}
                print(f"{name:16} {rate['plain']:12,.0f} {rate['tls']:12,.0f} {rate['tls'] / rate['plain']:10.2f} "
                      f"{cpu['plain']:13.2f} {cpu['tls']:11.2f}", flush=True)
        finally:
            plain.stop()


if __name__ == "__main__":
    main()
