#!/bin/sh
# Starts Warren with the image's config file; extra arguments (e.g. --log-level debug) override its values.
# exec makes warren-server PID 1's replacement, so `docker stop` (SIGTERM) reaches it and it shuts down cleanly.
set -e
exec warren-server --config /etc/warren/warren.toml "$@"
