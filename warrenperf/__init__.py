"""warren-perf: a load tool for any AMQP 0-9-1 broker, as RabbitMQ's PerfTest and lavinmqperf (docs/benchmarks.md).

Producers and consumers run as processes of their own on a lean client (warrenperf.client); `make bench` and the
benchmarks' figures use the same code."""
