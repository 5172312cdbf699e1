"""The Docker entrypoint generates no default password when the config's [[users]] or its load_definitions file
define users: they replace the default user, so a generated password would be one nobody can use."""

from __future__ import annotations

import json

from tests.unit.docker import test_docker_entrypoint

entrypoint = test_docker_entrypoint.entrypoint  # the fixture that runs the entrypoint with a fake warren-server


def test_users_from_the_config_replace_the_generated_password(entrypoint, tmp_path):
    config = tmp_path / "warren.toml"
    config.write_text('[[users]]\nname = "app"\npassword = "chosen"\n')
    given, log = entrypoint(WARREN_CONFIG=str(config))
    assert given["password"] is None and "generated" not in log
    assert not (tmp_path / "generated-pass").exists()


def test_users_from_a_definitions_file_replace_the_generated_password(entrypoint, tmp_path):
    definitions = tmp_path / "definitions.json"
    definitions.write_text(json.dumps({"users": [{"name": "app", "password": "chosen"}]}))
    config = tmp_path / "warren.toml"
    config.write_text(f'[server]\nload_definitions = "{definitions}"\n')
    given, log = entrypoint(WARREN_CONFIG=str(config))
    assert given["password"] is None and "generated" not in log


def test_a_definitions_file_without_users_keeps_the_generated_password(entrypoint, tmp_path):
    definitions = tmp_path / "definitions.json"
    definitions.write_text(json.dumps({"vhosts": [{"name": "prod"}]}))
    config = tmp_path / "warren.toml"
    config.write_text(f'[server]\nload_definitions = "{definitions}"\n')
    given, log = entrypoint(WARREN_CONFIG=str(config))
    assert given["password"] not in (None, "guest") and given["password"] in log
