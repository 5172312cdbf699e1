# Warren, an AMQP 0-9-1 message broker:
#   docker build -t warren . && docker run -p 5672:5672 -e WARREN_DEFAULT_USER=app -e WARREN_DEFAULT_PASS=... warren
# Without WARREN_DEFAULT_PASS (or a config file with a password), the entrypoint generates one and logs it once.

# The wheel, built where a C compiler is: mypyc compiles the modules on the path of every message (setup.py).
FROM python:3.11-slim AS wheel

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*

# Every package pyproject.toml installs (tests/unit/test_packaging.py keeps the two lists the same).
COPY pyproject.toml setup.py README.md /src/
COPY protocol/ /src/protocol/
COPY broker/ /src/broker/
COPY storage/ /src/storage/
COPY cluster/ /src/cluster/
COPY spark_connector/ /src/spark_connector/
COPY warrenctl/ /src/warrenctl/
COPY warrenperf/ /src/warrenperf/
RUN pip wheel --no-deps --wheel-dir /wheels /src

# The image: the wheel installed, no compiler.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The build stops here unless every module is compiled, by the check the broker makes at start.
COPY --from=wheel /wheels/ /tmp/wheels/
RUN pip install /tmp/wheels/*.whl && rm -rf /tmp/wheels && python -m broker.compiled --check

COPY docker/warren.toml /etc/warren/warren.toml
COPY docker/entrypoint.sh /usr/local/bin/warren-entrypoint.sh
RUN chmod 0755 /usr/local/bin/warren-entrypoint.sh \
    && useradd --system --uid 10001 --user-group --home-dir /var/lib/warren --shell /usr/sbin/nologin warren \
    && mkdir -p /var/lib/warren \
    && chown warren:warren /var/lib/warren

VOLUME /var/lib/warren
EXPOSE 5672 1883 15672 15692
USER warren
WORKDIR /var/lib/warren

HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import socket; socket.create_connection(('127.0.0.1', 5672), timeout=3).close()"]

ENTRYPOINT ["/usr/local/bin/warren-entrypoint.sh"]
