#!/bin/sh
# Starts Warren with the image's config file; extra arguments (e.g. --log-level debug) override its values.
#
# The image never offers the well-known password "guest" to the network (its config lets the default user log in
# from anywhere). The default user and password come from WARREN_DEFAULT_USER / WARREN_DEFAULT_PASS, else from the
# config file; if neither sets a password other than "guest", one is generated at the first start, logged once,
# and kept in the volume (readable by the warren user only) for the starts after it.
#
# exec makes warren-server PID 1's replacement, so `docker stop` (SIGTERM) reaches it and it shuts down cleanly.
set -eu

CONFIG=${WARREN_CONFIG:-/etc/warren/warren.toml}
GENERATED_PASS_FILE=${WARREN_GENERATED_PASS_FILE:-/var/lib/warren/generated-default-pass}

# The config file's default user and password, one per line (nothing if it cannot be read: warren-server then
# reports why; nothing either if its [[users]] or load_definitions file define users, which replace the default
# user).
configured_credentials() {
    python -c 'import sys
from broker.config import load_config, read_definitions
config = load_config(sys.argv[1])
if not config.users and not (config.load_definitions and read_definitions(config.load_definitions).get("users")):
    print(config.default_user)
    print(config.default_pass)' "$CONFIG" 2>/dev/null || true
}

if [ -z "${WARREN_DEFAULT_PASS:-}" ]; then
    credentials=$(configured_credentials)
    configured_user=$(printf '%s\n' "$credentials" | sed -n 1p)
    configured_pass=$(printf '%s\n' "$credentials" | sed -n 2p)
    if [ -n "$credentials" ] && [ "$configured_pass" = guest ]; then
        user=${WARREN_DEFAULT_USER:-$configured_user}
        if [ -s "$GENERATED_PASS_FILE" ]; then
            echo "warren: user '$user' has the password generated at the first start (in $GENERATED_PASS_FILE)" >&2
        else
            (umask 077 && python -c 'import secrets; print(secrets.token_urlsafe(18))' >"$GENERATED_PASS_FILE")
            echo "warren: no WARREN_DEFAULT_PASS given: user '$user' gets the generated password" \
                "$(cat "$GENERATED_PASS_FILE") (kept in $GENERATED_PASS_FILE; set WARREN_DEFAULT_USER and" \
                "WARREN_DEFAULT_PASS to choose)" >&2
        fi
        WARREN_DEFAULT_PASS=$(cat "$GENERATED_PASS_FILE")
        export WARREN_DEFAULT_PASS
    fi
fi

exec warren-server --config "$CONFIG" "$@"
