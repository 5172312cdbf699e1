# Warren, an AMQP 0-9-1 message broker:
#   docker build -t warren . && docker run -p 5672:5672 -e WARREN_DEFAULT_USER=app -e WARREN_DEFAULT_PASS=... warren
# Without WARREN_DEFAULT_PASS (or a config file with a password), the entrypoint generates one and logs it once.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Install the package from a scratch copy of the sources, which is removed afterwards: every package pyproject.toml
# installs (tests/unit/test_packaging.py keeps the two lists the same).
COPY pyproject.toml README.md /tmp/warren-src/
COPY protocol/ /tmp/warren-src/protocol/
COPY broker/ /tmp/warren-src/broker/
COPY storage/ /tmp/warren-src/storage/
COPY cluster/ /tmp/warren-src/cluster/
COPY spark_connector/ /tmp/warren-src/spark_connector/
COPY warrenctl/ /tmp/warren-src/warrenctl/
RUN pip install /tmp/warren-src && rm -rf /tmp/warren-src

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
