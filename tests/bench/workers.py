"""What several worker processes cost: the hand-off of a connection, and broker CPU per message.

    python -m tests.bench.workers [--seconds N] [--opens N]
    python -m tests.bench.workers --scale 1,2,4,8 [--pin] [--independent] [--seconds N]
    python -m tests.bench.workers --scale 1,2,4,8 --one-vhost [--spread] [--seconds N]

- Opening a connection (TCP connect to connection.open-ok, the bench client) to vhost v1: on one worker, and on two
  workers where worker 1 leads v1, counting only the connections worker 0 accepted and handed over (their client
  ports, from its debug log). Each follows a connection to / (untimed), so that worker 0 is as awake as worker 1.
- Broker CPU per message (all its processes), a producer and a consumer process per busy vhost, 16 B, auto-ack:
  one worker with one busy vhost, against two workers with the same one busy vhost (what the hand-off and the
  shared definitions cost per message), and two workers with a busy vhost each.

Brokers alternate (1 2 2 1) and each figure is the mean of its two runs. On a 2-core machine the load generators
share the cores with the workers, so rates say little here; CPU per message is the figure to read.

With --scale, throughput as workers are added: N workers, a busy vhost on each (its own producer and consumer
processes), against N times what one worker does; it needs a core for each worker and two for each vhost's load.
The counts run forward then backward (1 2 4 8 8 4 2 1), each figure the mean of its two runs, with the cores the
broker and the load generators kept busy: where the two add up to the machine's cores, the machine was the limit.
With --pin, each run's broker gets the first hardware thread of N physical cores of its own and the load generators
the other cores (or, where none are left, the broker's cores' other threads): what N workers do when each has a core.
With --independent, N one-process brokers run side by side instead (each its own data dir and port, pinned to a
core of its own with --pin): what the machine itself gives N busy processes, the figure to read the workers' against.
With --one-vhost, N busy queues share one vhost instead, on N workers, beside RabbitMQ with the same N queues (the
two alternated): what an application of one vhost gets from more cores. Warren places them `balanced` ([queues]
leader_locator), so that each worker owns one (docs/workers.md#queues-of-one-vhost-over-workers), while the worker
of the vhost serves every client; with --spread ([server] spread_vhosts), each client is served by the worker the
kernel gives it (docs/workers.md#one-vhost-on-every-worker).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.bench.brokers import REPO_ROOT, RunningBroker, start_rabbitmq, start_warren
from tests.bench.compare import _failure
from warrenperf.client import BenchConnection, BrokerURL
from warrenperf.process_memory import cpu_seconds, descendants
from warrenperf.roles import Split, command, time_limit

def config_of(vhosts: list[str]) -> str:
    """A config that makes these vhosts (besides /), with guest's permissions on each."""
    return "".join(f"""
[[vhosts]]
name = "{name}"

[[permissions]]
user = "guest"
vhost = "{name}"
configure = ".*"
write = ".*"
read = ".*"
""" for name in vhosts if name != "/")


def scale_vhosts(workers: int) -> list[str]:
    """A vhost per worker: placed in order on the workers that lead fewest, the N-th lands on worker N."""
    return ["/", *(f"v{number}" for number in range(1, workers))]


def url(broker: RunningBroker, vhost: str) -> str:
    return f"amqp://guest:guest@127.0.0.1:{broker.port}/{vhost.replace('/', '%2F')}"


async def open_times(target: str, opens: int, other: str) -> dict[int, float]:
    """Seconds from connect to open-ok, for opens connections to target one after another, by the client's port.
    Each follows an untimed connection to other, so that the worker leading other is as awake as target's when the
    kernel offers the connection to both (a busy one wins the accept); the first, untimed, waits for target's
    worker to serve."""
    await (await BenchConnection.open(BrokerURL.parse(target))).close()
    times = {}
    for _ in range(opens):
        await (await BenchConnection.open(BrokerURL.parse(other))).close()
        started = time.perf_counter()
        connection = await BenchConnection.open(BrokerURL.parse(target))
        times[connection.transport.get_extra_info("sockname")[1]] = time.perf_counter() - started
        await connection.close()
    return times


def handed_ports(log: Path) -> set[int]:
    """The client ports of the connections a worker handed to another (its debug lines say so)."""
    return {int(port) for port in re.findall(r"connection 127\.0\.0\.1:(\d+) -> \S+ handed to", log.read_text())}


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


def loadgen(target: str, role: str, seconds: float, queue: str, cpus: set[int] | None) -> subprocess.Popen:
    return subprocess.Popen(command(role, target, Split(queue=queue), seconds), cwd=REPO_ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus))


def physical_cores() -> list[list[int]]:
    """The CPUs this process may use, grouped by physical core (a core's hardware threads together), in order."""
    cores: dict[tuple[str, str], list[int]] = {}
    for cpu in sorted(os.sched_getaffinity(0)):
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        core = ((topology / "physical_package_id").read_text().strip(), (topology / "core_id").read_text().strip())
        cores.setdefault(core, []).append(cpu)
    return list(cores.values())


def pinned_cpus(workers: int) -> tuple[set[int], set[int]]:
    """The broker's CPUs (a thread of each of `workers` physical cores) and the load generators' (the other cores,
    else the broker's cores' other threads, else the broker's own)."""
    cores = physical_cores()
    broker = {core[0] for core in cores[:workers]}
    load = ({cpu for core in cores[workers:] for cpu in core} or {cpu for core in cores[:workers] for cpu in core[1:]}
            or broker)
    return broker, load


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of pid and of the processes below it onto cpus (the threads they start later inherit it)."""
    for process in [pid, *descendants(pid)]:
        for thread in os.listdir(f"/proc/{process}/task"):
            os.sched_setaffinity(int(thread), cpus)


def cpu_list(cpus: set[int]) -> str:
    return ",".join(map(str, sorted(cpus)))


def busy_vhosts(broker: RunningBroker, vhosts: list[str], seconds: float,
                load_cpus: set[int] | None = None) -> dict[str, float]:
    """A consumer and a producer process per vhost, all started at once; delivered messages, the broker's CPU
    microseconds per message (its supervisor, workers and their threads), and the cores the broker and the load
    generators kept busy."""
    return busy([(broker, vhost, queue_of(vhost)) for vhost in vhosts], seconds, load_cpus)


def queue_of(vhost: str) -> str:
    return f"bench-workers-{vhost.strip('/') or 'root'}"


def busy(targets: list[tuple[RunningBroker, str, str]], seconds: float,
         load_cpus: set[int] | None) -> dict[str, float]:
    """busy_vhosts over (broker, vhost, queue) targets, a consumer and a producer process each: the brokers' CPU
    added up."""
    sides = [(vhost, loadgen(url(broker, vhost), role, seconds, queue, load_cpus))
             for broker, vhost, queue in targets for role in ("consumer", "producer")]
    brokers = list({broker.process.pid: broker for broker, _, _ in targets}.values())
    try:
        for _, side in sides:
            if side.stdout.readline().strip() != "ready":
                raise RuntimeError(_failure(side.communicate()[1], side.wait()))
        before = sum(cpu_seconds(broker.process.pid) for broker in brokers)
        load_before = _children_cpu_seconds()
        started = time.perf_counter()
        for _, side in sides:
            side.stdin.write("go\n")
            side.stdin.flush()
        producers, consumers = sides[1::2], sides[0::2]
        for _, producer in producers:
            producer.communicate(timeout=time_limit(seconds))
        for _, consumer in consumers:
            consumer.stdin.write("stop\n")
            consumer.stdin.flush()
        cpu = sum(cpu_seconds(broker.process.pid) for broker in brokers) - before
        elapsed = time.perf_counter() - started  # longer than seconds where the load generators start late
        delivered = sum(json.loads(consumer.communicate(timeout=time_limit(seconds))[0].splitlines()[-1])["delivered"]
                        for _, consumer in consumers)
        load = _children_cpu_seconds() - load_before  # the load generators, reaped by now (the broker is not yet)
    finally:
        for _, side in sides:
            if side.poll() is None:
                side.kill()
    return {"delivered": delivered, "msg/s": delivered / elapsed, "cpu us/msg": cpu * 1e6 / delivered,
            "broker cores": cpu / elapsed, "load cores": load / elapsed}


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(workdir: Path, workers: int, args: argparse.Namespace) -> dict[str, float]:
    config = workdir / "warren.toml"
    config.write_text(config_of(["v1"]))
    broker = start_warren(workdir, "--workers", str(workers), "--config", str(config), "--log-level", "debug")
    try:
        opened = asyncio.run(open_times(url(broker, "v1"), args.opens, url(broker, "/")))
        handed = handed_ports(workdir / "warren.log")
        times = [seconds for port, seconds in opened.items() if (port in handed) == (workers > 1)]
        one = busy_vhosts(broker, ["v1"], args.seconds)
        both = busy_vhosts(broker, ["/", "v1"], args.seconds) if workers > 1 else one
    finally:
        broker.stop()
    return {"open p50 ms": statistics.median(times) * 1000, "open p90 ms": percentile(times, 0.9) * 1000,
            "handed": len(handed & opened.keys()), "one msg/s": one["msg/s"],
            "one cpu us/msg": one["cpu us/msg"], "both msg/s": both["msg/s"], "both cpu us/msg": both["cpu us/msg"]}


def scale(counts: list[int], seconds: float, pinned: bool, independent: bool = False) -> None:
    """Throughput with N workers and a busy vhost on each, for each N of counts (forward, then backward), against N
    times one worker's; pinned, on N physical cores of the broker's own. Independent: N one-process brokers side
    by side instead, a busy vhost on each (what the machine itself gives N processes)."""
    runs: dict[int, list[dict[str, float]]] = {workers: [] for workers in counts}
    with tempfile.TemporaryDirectory(prefix="warren-bench-workers-") as scratch:
        for index, workers in enumerate([*counts, *reversed(counts)]):
            workdir = Path(scratch) / f"scale-{index}-{workers}"
            brokers: list[RunningBroker] = []
            try:
                if independent:
                    for number in range(workers):
                        (workdir / str(number)).mkdir(parents=True)
                        brokers.append(start_warren(workdir / str(number)))
                    targets = [(broker, "/", queue_of("/")) for broker in brokers]
                else:
                    workdir.mkdir()
                    vhosts = scale_vhosts(workers)
                    (workdir / "warren.toml").write_text(config_of(vhosts))
                    brokers.append(start_warren(workdir, "--workers", str(workers), "--config",
                                                str(workdir / "warren.toml")))
                    targets = [(brokers[0], vhost, queue_of(vhost)) for vhost in vhosts]
                broker_cpus, load_cpus = pinned_cpus(workers) if pinned else (None, None)
                if broker_cpus is not None:
                    if independent:  # a core each
                        for broker, cpu in zip(brokers, sorted(broker_cpus)):
                            pin(broker.process.pid, {cpu})
                    else:
                        pin(brokers[0].process.pid, broker_cpus)
                    print(f"{workers} {'brokers' if independent else 'workers'} on CPUs {cpu_list(broker_cpus)}, "
                          f"load on {cpu_list(load_cpus)}")
                runs[workers].append(busy(targets, seconds, load_cpus))
            finally:
                for broker in brokers:
                    broker.stop()
    means = {workers: {key: statistics.mean(run[key] for run in figures) for key in figures[0]}
             for workers, figures in runs.items()}
    one = means[1]["msg/s"] if 1 in means else None
    what = "brokers" if independent else "workers"
    print(f"{what:>8} {'busy vhosts':>12} {'msg/s in all':>14} {f'/ (N x 1 {what[:-1]})':>17} {'CPU µs/msg':>11} "
          f"{'broker cores':>13} {'load cores':>11}")
    for workers, figures in means.items():
        share = f"{figures['msg/s'] / (workers * one):.2f}" if one else "-"
        print(f"{workers:8} {workers:12} {figures['msg/s']:14.0f} {share:>17} {figures['cpu us/msg']:11.2f} "
              f"{figures['broker cores']:13.2f} {figures['load cores']:11.2f}")
    print(f"a producer and a consumer process per busy vhost, 16 B, auto-ack, {seconds:g} s a run, {os.cpu_count()} "
          f"CPUs on {len(physical_cores())} physical cores{', pinned' if pinned else ''}"
          + ("; N one-process brokers side by side, each its own data dir and port: what the machine gives N "
             "processes, to read the workers' figures against" if independent else
             "; goal: msg/s in all >= 0.85 x N x 1 worker's, where the machine has cores for the workers and their "
             "load generators"))


BALANCED_QUEUES = '[queues]\nleader_locator = "balanced"\n'  # each new queue on the worker that owns fewest


SPREAD_VHOSTS = "[server]\nspread_vhosts = true\n"  # every worker serves the vhost's clients


def one_vhost(counts: list[int], seconds: float, spread: bool) -> None:
    """Throughput of N busy queues in one vhost (a producer and a consumer process each) on N workers, beside
    RabbitMQ with the same N queues, for each N of counts (forward, then backward, the brokers alternated); spread:
    each client served by the worker that accepts it."""
    runs: dict[tuple[str, int], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="warren-bench-one-vhost-") as scratch:
        os.chmod(scratch, 0o755)  # rabbitmq-server runs as the rabbitmq user and must reach its data dir
        for index, queues in enumerate([*counts, *reversed(counts)]):
            for name in ("Warren", "RabbitMQ") if index % 2 == 0 else ("RabbitMQ", "Warren"):
                workdir = Path(scratch) / f"{index}-{name}"
                workdir.mkdir()
                (workdir / "warren.toml").write_text((SPREAD_VHOSTS if spread else "") + BALANCED_QUEUES)
                broker = (start_warren(workdir, "--workers", str(queues), "--config", str(workdir / "warren.toml"))
                          if name == "Warren" else start_rabbitmq(workdir))
                try:
                    targets = [(broker, "/", f"bench-one-vhost-{number}") for number in range(queues)]
                    runs.setdefault((name, queues), []).append(busy(targets, seconds, None))
                finally:
                    broker.stop()
    means = {key: {figure: statistics.mean(run[figure] for run in figures) for figure in figures[0]}
             for key, figures in runs.items()}
    print(f"{'broker':>8} {'queues':>7} {'workers':>8} {'msg/s in all':>13} {'/ (N x 1 queue)':>16} "
          f"{'CPU µs/msg':>11} {'broker cores':>13} {'load cores':>11} {'Warren / RabbitMQ':>18}")
    for name in ("Warren", "RabbitMQ"):
        one = means[(name, counts[0])]["msg/s"] / counts[0]
        for queues in counts:
            figures = means[(name, queues)]
            ratio = figures["msg/s"] / means[("RabbitMQ", queues)]["msg/s"]
            print(f"{name:>8} {queues:7} {queues if name == 'Warren' else '-':>8} {figures['msg/s']:13.0f} "
                  f"{figures['msg/s'] / (queues * one):16.2f} {figures['cpu us/msg']:11.2f} "
                  f"{figures['broker cores']:13.2f} {figures['load cores']:11.2f} "
                  f"{f'{ratio:.2f}' if name == 'Warren' else '':>18}")
    print(f"one vhost, a producer and a consumer process per queue, 16 B, auto-ack, {seconds:g} s a run, "
          f"{os.cpu_count()} CPUs; Warren runs as many workers as queues, a queue owned by each"
          + ("; every worker serves the vhost's clients (spread_vhosts)" if spread else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.workers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="of each busy run")
    parser.add_argument("--opens", type=int, default=300, help="connections opened one after another")
    parser.add_argument("--scale", help="instead: throughput with these numbers of workers, e.g. 1,2,4,8")
    parser.add_argument("--pin", action="store_true", help="with --scale: the broker on physical cores of its own")
    parser.add_argument("--independent", action="store_true",
                        help="with --scale: N one-process brokers side by side instead of N workers")
    parser.add_argument("--one-vhost", action="store_true",
                        help="with --scale: N busy queues in one vhost on N workers, beside RabbitMQ")
    parser.add_argument("--spread", action="store_true",
                        help="with --one-vhost: every worker serves the vhost's clients ([server] spread_vhosts)")
    args = parser.parse_args(argv)
    if args.scale and args.one_vhost:
        one_vhost([int(count) for count in args.scale.split(",")], args.seconds, args.spread)
        return 0
    if args.scale:
        scale([int(count) for count in args.scale.split(",")], args.seconds, args.pin, args.independent)
        return 0
    results: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory(prefix="warren-bench-workers-") as scratch:
        for index, workers in enumerate((1, 2, 2, 1)):
            workdir = Path(scratch) / str(index)
            workdir.mkdir()
            results[workers].append(run(workdir, workers, args))
    means = {workers: {key: statistics.mean(run[key] for run in runs) for key in runs[0]}
             for workers, runs in results.items()}
    print(f"{'':66} {'1 worker':>10} {'2 workers':>10} {'ratio':>6}")
    for label, key in (("open a connection to v1, p50 (ms; 2 workers: those handed over)", "open p50 ms"),
                       ("open a connection to v1, p90 (ms)", "open p90 ms"),
                       ("one busy vhost, 16 B auto-ack (msg/s)", "one msg/s"),
                       ("  broker CPU per message, all processes (µs)", "one cpu us/msg"),
                       ("a busy vhost on each worker, in all (msg/s)", "both msg/s"),
                       ("  broker CPU per message, all processes (µs)", "both cpu us/msg")):
        one, two = means[1][key], means[2][key]
        print(f"{label:66} {one:10.2f} {two:10.2f} {two / one:6.2f}")
    print(f"connections handed over with 2 workers: {means[2]['handed']:.0f} of {args.opens}")
    print("(1 worker has one vhost busy in both rows: the ratio of the last two rows compares two busy workers with "
          "one)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
