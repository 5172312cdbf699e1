"""The Docker image's entrypoint never hands guest/guest to the network: the default credentials come from
WARREN_DEFAULT_USER/WARREN_DEFAULT_PASS or the config file, else a password is generated once, logged once and
kept. Run without Docker: the entrypoint execs a fake warren-server that records what it was given."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from broker.__main__ import config_overrides, parse_args
from broker.config import load_config
from tests.conftest import REPO_ROOT

ENTRYPOINT = REPO_ROOT / "docker" / "entrypoint.sh"
IMAGE_CONFIG = REPO_ROOT / "docker" / "warren.toml"

FAKE_SERVER = """#!/bin/sh
exec python -c 'import json, os, sys
print(json.dumps({"argv": sys.argv[1:], "user": os.environ.get("WARREN_DEFAULT_USER"),
                  "password": os.environ.get("WARREN_DEFAULT_PASS")}))' "$@"
"""


@pytest.fixture
def entrypoint(tmp_path):
    """Run the entrypoint with extra environment variables; returns (what warren-server got, the log)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    server = bin_dir / "warren-server"
    server.write_text(FAKE_SERVER)
    server.chmod(0o755)
    base = {key: value for key, value in os.environ.items() if not key.startswith("WARREN_")}
    base.update(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", PYTHONPATH=str(REPO_ROOT),
                WARREN_CONFIG=str(IMAGE_CONFIG), WARREN_GENERATED_PASS_FILE=str(tmp_path / "generated-pass"))

    def run(*args: str, **environment: str) -> tuple[dict, str]:
        result = subprocess.run(["sh", str(ENTRYPOINT), *args], env={**base, **environment}, capture_output=True,
                                text=True, timeout=30, check=True)
        return json.loads(result.stdout), result.stderr

    return run


def test_without_credentials_a_password_is_generated_logged_once_and_kept(entrypoint, tmp_path):
    given, log = entrypoint("--log-level", "debug")
    password = given["password"]
    assert given["argv"] == ["--config", str(IMAGE_CONFIG), "--log-level", "debug"]
    assert password != "guest" and len(password) >= 20
    assert log.count(password) == 1 and "user 'guest'" in log
    kept = tmp_path / "generated-pass"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    # the next start (a container restart) keeps the password and does not log it again
    again, log = entrypoint()
    assert again["password"] == password
    assert password not in log and str(kept) in log


def test_a_generated_password_goes_to_the_user_named_in_the_environment(entrypoint):
    given, log = entrypoint(WARREN_DEFAULT_USER="app")
    assert given["user"] == "app" and given["password"] not in (None, "", "guest")
    assert "user 'app'" in log


def test_credentials_from_the_environment_are_used_as_given(entrypoint, tmp_path):
    given, log = entrypoint(WARREN_DEFAULT_USER="app", WARREN_DEFAULT_PASS="s3cret")
    assert (given["user"], given["password"], log) == ("app", "s3cret", "")
    assert not (tmp_path / "generated-pass").exists()


def test_a_password_from_the_config_file_is_used_as_given(entrypoint, tmp_path):
    config = tmp_path / "warren.toml"
    config.write_text('[amqp]\ndefault_user = "app"\ndefault_pass = "s3cret"\n')
    given, log = entrypoint(WARREN_CONFIG=str(config))
    assert (given["argv"], given["password"], log) == (["--config", str(config)], None, "")
    assert not (tmp_path / "generated-pass").exists()


def test_a_config_file_that_cannot_be_read_is_left_to_warren_server_to_report(entrypoint, tmp_path):
    given, log = entrypoint(WARREN_CONFIG=str(tmp_path / "missing.toml"))
    assert (given["argv"], given["password"], log) == (["--config", str(tmp_path / "missing.toml")], None, "")


def test_the_broker_takes_the_default_credentials_from_the_environment(tmp_path):
    config = tmp_path / "warren.toml"
    config.write_text('[amqp]\ndefault_user = "file-user"\ndefault_pass = "file-pass"\n')
    args = parse_args(["--config", str(config)])
    environ = {"WARREN_DEFAULT_USER": "app", "WARREN_DEFAULT_PASS": "s3cret"}
    config = load_config(args.config, config_overrides(args, environ))
    assert (config.default_user, config.default_pass) == ("app", "s3cret")
    unset = {"WARREN_DEFAULT_USER": "", "WARREN_DEFAULT_PASS": ""}  # empty is unset: the config file applies
    config = load_config(args.config, config_overrides(args, unset))
    assert (config.default_user, config.default_pass) == ("file-user", "file-pass")
