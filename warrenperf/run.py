"""One load run: consumer and producer processes (warrenperf.roles) started together once all are ready, their
figures merged, and the CPU time the broker and the clients spent on it."""

from __future__ import annotations

import json
import statistics
import subprocess
from contextlib import ExitStack
from urllib.parse import urlsplit

from warrenperf.process_memory import cpu_seconds, listener_pid
from warrenperf.roles import Split, command, time_limit

Figures = dict[str, float]


def broker_process(url: str) -> int | None:
    """The process that serves url when it runs on this machine (its CPU time is then measured), else None."""
    parts = urlsplit(url)
    if parts.hostname not in ("localhost", "::1") and not (parts.hostname or "").startswith("127."):
        return None
    try:
        return listener_pid(parts.port or (5671 if parts.scheme == "amqps" else 5672))
    except LookupError:
        return None


def run(url: str, split: Split, seconds: float, producers: int = 1, consumers: int = 1,
        broker_pid: int | None = None) -> Figures | str:
    """The merged figures of `producers` producer and `consumers` consumer processes, or why the run failed.

    Rates are totals over the processes of a side; "cpu us/msg" is the broker's CPU time per delivered message
    (when broker_pid is known), "client cpu us/msg" that of every side's process together; latencies (with
    split.latency) are end to end, publishing to arrival, over every consumer's samples."""
    with ExitStack() as cleanup:
        sides = {role: [_start(cleanup, command(role, url, split, seconds)) for _ in range(count)]
                 for role, count in (("consumer", consumers), ("producer", producers))}
        every = sides["consumer"] + sides["producer"]
        for side in every:
            if side.stdout.readline().strip() != "ready":
                return _failure(side)
        broker_before = cpu_seconds(broker_pid) if broker_pid else 0.0
        for side in every:
            side.stdin.write("go\n")
            side.stdin.flush()
        try:
            produced = [_figures(side, seconds) for side in sides["producer"]]
            for side in sides["consumer"]:
                side.stdin.write("stop\n")
                side.stdin.flush()
            broker_cpu = cpu_seconds(broker_pid) - broker_before if broker_pid else None
            consumed = [_figures(side, seconds) for side in sides["consumer"]]
        except subprocess.TimeoutExpired:
            return "timed out"
        except _SideFailed as failure:
            return str(failure)
        return _merged(produced, consumed, broker_cpu)


class _SideFailed(Exception):
    """A side exited with an error (the message is its last line of stderr)."""


def _start(cleanup: ExitStack, argv: list[str]) -> subprocess.Popen:
    side = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cleanup.callback(lambda: side.poll() is None and side.kill())
    return side


def _failure(side: subprocess.Popen) -> str:
    side.kill()
    return _last_line(side.communicate()[1], side.wait())


def _last_line(stderr: str, returncode: int) -> str:
    lines = stderr.strip().splitlines()
    return lines[-1] if lines else f"exit code {returncode}"


def _figures(side: subprocess.Popen, seconds: float) -> dict:
    output, errors = side.communicate(timeout=time_limit(seconds))
    if side.returncode != 0:
        raise _SideFailed(_last_line(errors, side.returncode))
    return json.loads(output.strip().splitlines()[-1])


def _merged(produced: list[dict], consumed: list[dict], broker_cpu: float | None) -> Figures:
    delivered = sum(figures["delivered"] for figures in consumed)
    client_cpu = sum(figures["cpu seconds"] for figures in produced + consumed)  # from "go" to each side's end
    figures: Figures = {
        "published/s": sum(figures["published/s"] for figures in produced),
        "published": sum(figures["published"] for figures in produced),
        "msg/s": sum(figures["msg/s"] for figures in consumed),
        "delivered": delivered,
        "client cpu us/msg": client_cpu * 1e6 / delivered if delivered else 0.0,
    }
    if broker_cpu is not None:
        figures["cpu us/msg"] = broker_cpu * 1e6 / delivered if delivered else 0.0
    latencies = [latency for figures in consumed for latency in figures.get("latencies ms", ())]
    if len(latencies) >= 2:
        cuts = statistics.quantiles(latencies, n=100)
        figures.update({"p50 ms": cuts[49], "p95 ms": cuts[94], "p99 ms": cuts[98], "max ms": max(latencies)})
    return figures

