"""Configuration: defaults, the TOML file, command-line overrides, and clear errors for bad values."""

import re
import os
import subprocess
import sys

import pytest

from broker.__main__ import config_overrides, parse_args
from broker.config import ConfigError, load_config, read_secret
from tests.conftest import REPO_ROOT


def write(tmp_path, text: str):
    path = tmp_path / "warren.toml"
    path.write_text(text)
    return path


def test_defaults_match_rabbitmq():
    config = load_config()
    assert (config.port, config.frame_max, config.channel_max, config.heartbeat) == (5672, 131072, 2047, 60)
    assert (config.default_user, config.default_pass, config.default_vhost) == ("guest", "guest", "/")
    assert config.failed_login_delay == 1.0
    assert config.consumer_timeout == 1800000  # RabbitMQ's 30 minutes
    assert (config.management_port, config.prometheus_port) == (15672, 15692)  # as RabbitMQ's plugins


def test_file_then_overrides(tmp_path):
    path = write(tmp_path, '[server]\nport = 6000\nlog_level = "debug"\n[amqp]\ndefault_consumer_prefetch = 7\n'
                           '[prometheus]\nhost = "0.0.0.0"\nport = 9419\n')
    config = load_config(path, {"port": 6001, "host": None})
    assert (config.port, config.log_level, config.default_consumer_prefetch, config.host) == (
        6001, "debug", 7, "127.0.0.1")
    assert (config.prometheus_host, config.prometheus_port) == ("0.0.0.0", 9419)


@pytest.mark.parametrize("text, message", [
    ("[server]\nprot = 1\n", "unknown key 'prot' in [server]"),
    ("[sever]\nport = 1\n", "unknown section [sever]"),
    ('[server]\nport = "many"\n', "port must be an integer, got 'many'"),
    ("[server]\nport = 70000\n", "port must be between 0 and 65535, got 70000"),
    ("[amqp]\nframe_max = 1024\n", "frame_max must be at least 4096, got 1024"),
    ('[server]\nlog_level = "loud"\n', "log_level must be one of debug, info, warning, error, got 'loud'"),
    ("[amqp]\nheartbeat = true\n", "heartbeat must be an integer, got True"),
    ("[server\n", "is not valid TOML"),
    ("[amqp]\nfailed_login_delay = -1\n", "failed_login_delay must be between 0 and 10, got -1"),
    ("[amqp]\nconsumer_timeout = -1\n", "consumer_timeout must be 0 (no limit) or more milliseconds, got -1"),
    ("[server]\nqueue_messages_in_memory = 0\n", "queue_messages_in_memory must be at least 1, got 0"),
    ("[federation]\ninternal_exchange_check_interval = 5\n",
     "federation internal_exchange_check_interval must be between 100 and 86400000 ms, got 5"),
    ("[prometheus]\nport = 99999\n", "prometheus_port must be between 0 and 65535, got 99999"),
    ("[tls]\nport = 70000\n", "tls_port must be between 0 and 65535, got 70000"),
    ('[tls]\ncertfile = "a.pem"\n', "tls certfile and keyfile go together: give both or neither"),
    ('[tls]\nfail_if_no_peer_cert = true\n', 'tls fail_if_no_peer_cert needs verify = "verify_peer"'),
    ('[server]\nlog_format = "xml"\n', "log_format must be one of text, json, got 'xml'"),
    ('[queues]\nleader_locator = "nearest"\n', "[queues] leader_locator must be one of client-local, balanced, "
                                               "random, least-leaders, min-masters, got 'nearest'"),
    ("[amqp]\nfailed_login_delay = 11.5\n", "failed_login_delay must be between 0 and 10, got 11.5"),
    ('[amqp]\nfailed_login_delay = "1s"\n', "failed_login_delay must be a number, got '1s'"),
    ("[server]\nworkers = 0\n", 'workers must be "auto" or between 1 and 256, got 0'),
    ('[server]\nworkers = "many"\n', "workers must be an integer, got 'many'"),
    *[(f"[server]\nworkers = {workers}\n[tls]\ncertfile = 'c.pem'\nkeyfile = 'k.pem'\n[management]\ntls = true\n"
       "[cluster]\netcd_endpoints = ['127.0.0.1:2379']\nnode_id = 'a'\n",
       "[management] tls with [cluster] etcd_endpoints needs [tls] cacertfile: the CA that signed the other nodes' "
       "certificates, which this node's API checks when it asks theirs") for workers in (1, 2)],
    ("[server]\nworkers = 2\nspread_vhosts = true\n[cluster]\netcd_endpoints = ['127.0.0.1:2379']\nnode_id = 'a'\n",
     "[server] spread_vhosts is for one node of workers: a cluster keeps each vhost in its replication group"),
    ('[server]\nspread_vhosts = "yes"\n', "spread_vhosts must be true or false, got 'yes'"),
    ("[server]\nworkers = 2\n[management]\nport = 0\n[prometheus]\nport = 0\n[cluster]\n"
     "etcd_endpoints = ['127.0.0.1:2379']\nnode_id = 'a'\nreplication_port = 65535\n",
     "[cluster] replication_port 65535: worker k's group uses replication_port + k, and 65536 is past 65535"),
])
def test_bad_config_is_refused_with_a_message_naming_the_problem(tmp_path, text, message):
    with pytest.raises(ConfigError) as error:
        load_config(write(tmp_path, text))
    assert message in str(error.value)


def test_auto_workers_are_one_per_core(tmp_path):
    config = load_config(write(tmp_path, '[server]\nworkers = "auto"\n'))
    assert config.workers == os.cpu_count()


def test_missing_file_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "absent.toml")


def test_the_server_exits_2_with_the_message_on_bad_config(tmp_path):
    path = write(tmp_path, "[amqp]\nchannel_max = 0\n")
    result = subprocess.run([sys.executable, "-m", "broker", "--config", str(path), "--data-dir", str(tmp_path),
                             "--management-port", "0", "--prometheus-port", "0", "--mqtt-port", "0"],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "warren-server: channel_max must be between 1 and 65535, got 0" in result.stderr


def test_loopback_users_must_be_a_list_of_names(tmp_path):
    with pytest.raises(ConfigError, match="loopback_users must be a list of strings, got"):
        load_config(write(tmp_path, '[amqp]\nloopback_users = "guest"\n'))


def test_users_vhosts_and_permissions_tables(tmp_path):
    config = load_config(write(tmp_path, """
[[vhosts]]
name = "prod"
description = "production"
[[users]]
name = "app"
password = "s3cret"
tags = ["management"]
[[users]]
name = "ops"
password_hash = "rKXnUP4htXFEykdVetqYH4AoIDOS/HGdFMHuHAL5nRHjmQIF"
hashing_algorithm = "rabbit_password_hashing_sha256"
[[permissions]]
user = "app"
vhost = "prod"
configure = "^app\\\\."
write = ".*"
read = ".*"
[[topic_permissions]]
user = "app"
vhost = "prod"
exchange = "amq.topic"
write = "^app\\\\."
read = ""
"""))
    assert config.vhosts == [{"name": "prod", "description": "production"}]
    assert [user["name"] for user in config.users] == ["app", "ops"]
    assert config.permissions == [{"user": "app", "vhost": "prod", "configure": "^app\\.", "write": ".*",
                                   "read": ".*"}]
    assert config.topic_permissions == [{"user": "app", "vhost": "prod", "exchange": "amq.topic", "write": "^app\\.",
                                         "read": ""}]


def test_load_definitions_names_a_json_file(tmp_path):
    definitions = tmp_path / "definitions.json"
    definitions.write_text('{"vhosts": [{"name": "prod"}]}')
    config = load_config(write(tmp_path, f'[server]\nload_definitions = "{definitions}"\n'))
    assert config.load_definitions == str(definitions)


@pytest.mark.parametrize("text, message", [
    ('[[users]]\nname = "app"\n', "[[users]] 'app': needs a password or a password_hash"),
    ('[[users]]\nname = "app"\npassword = "x"\nrole = "admin"\n', "[[users]] 'app': unknown key 'role'"),
    ('[[users]]\nname = "app"\npassword = 7\n', "[[users]] 'app': password must be a string, got 7"),
    ('[[shovels]]\nsrc-queue = "q"\n', "[[shovels]]: name missing"),
    ('[[shovels]]\nname = "s"\nvhost = 5\n', "[[shovels]] 's': vhost must be a string, got 5"),
    ('[[users]]\nname = "app"\npassword = "x"\ntags = "administrator"\n',
     "[[users]] 'app': tags must be a list of strings, got 'administrator'"),
    ('[[users]]\npassword = "x"\n', "[[users]]: name missing"),
    ('[[vhosts]]\ndescription = "x"\n', "[[vhosts]]: name missing"),
    ('[server]\nworkers = 2\n[[vhosts]]\nname = "v"\nworker = 2\n',
     "[[vhosts]] 'v': worker 2 does not exist: workers are numbered from 0 to 1"),
    ('[[vhosts]]\nname = "v"\nworker = "1"\n', "[[vhosts]] 'v': worker must be a worker number, got '1'"),
    ('[[vhosts]]\nname = "v"\nworker = true\n', "[[vhosts]] 'v': worker must be a worker number, got True"),
    ('[[permissions]]\nuser = "app"\nvhost = "/"\nconfigure = ".*"\n',
     "[[permissions]] 'app': write, read missing"),
    ('[[topic_permissions]]\nuser = "app"\nvhost = "/"\nwrite = ".*"\nread = ""\n',
     "[[topic_permissions]] 'app': exchange missing"),
    ('[users]\nname = "app"\n', "unknown section [users]"),
    ("users = 3\n", "unknown section [users]"),
    ('[server]\nload_definitions = 3\n', "load_definitions must be a string, got 3"),
])
def test_bad_users_vhosts_and_permissions_are_refused_by_name(tmp_path, text, message):
    with pytest.raises(ConfigError) as error:
        load_config(write(tmp_path, text))
    assert message in str(error.value)


@pytest.mark.parametrize("content, message", [
    (None, "cannot read load_definitions file {path}: No such file or directory"),
    ("{not json", "load_definitions file {path} is not valid JSON"),
    ("[]", "load_definitions file {path} must hold a JSON object, not list"),
])
def test_an_unusable_definitions_file_is_refused(tmp_path, content, message):
    path = tmp_path / "definitions.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as error:
        load_config(write(tmp_path, f'[server]\nload_definitions = "{path}"\n'))
    assert message.format(path=path) in str(error.value)


def test_the_server_exits_2_when_a_user_has_no_password(tmp_path):
    path = write(tmp_path, '[[users]]\nname = "app"\ntags = ["administrator"]\n')
    result = subprocess.run([sys.executable, "-m", "broker", "--config", str(path), "--data-dir", str(tmp_path),
                             "--management-port", "0", "--prometheus-port", "0", "--mqtt-port", "0"],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert result.stderr.strip() == "warren-server: [[users]] 'app': needs a password or a password_hash"


CLUSTER = '[cluster]\netcd_endpoints = ["127.0.0.1:2379"]\nnode_id = "n1"\n'


def test_a_cluster_section_makes_a_clustered_node(tmp_path):
    path = tmp_path / "warren.toml"
    path.write_text(CLUSTER + "replication_port = 5690\nlease_ttl = 2\nack_timeout = 1.5\nmin_insync = 3\n")
    config = load_config(path)
    assert (config.cluster_etcd_endpoints, config.cluster_node_id, config.cluster_replication_port) == (
        ["127.0.0.1:2379"], "n1", 5690)
    assert (config.cluster_lease_ttl, config.cluster_ack_timeout, config.cluster_min_insync) == (2, 1.5, 3)
    assert load_config().cluster_etcd_endpoints == []  # no [cluster]: one node, as before


@pytest.mark.parametrize("text, message", [
    ('[cluster]\netcd_endpoints = ["127.0.0.1:2379"]\n', "cluster node_id must be 1 to 64 letters"),
    ('[cluster]\netcd_endpoints = ["etcd"]\nnode_id = "n1"\n', "etcd_endpoints must be \"host:port\" addresses"),
    (CLUSTER + 'lease_ttl = 0.5\n', "cluster lease_ttl must be between 1 and 60 seconds, got 0.5"),
    (CLUSTER + 'ack_timeout = 0\n', "cluster ack_timeout must be between 0.1 and 60 seconds, got 0"),
    (CLUSTER + 'min_insync = 0\n', "cluster min_insync must be between 1 and 9, got 0"),
    (CLUSTER + 'replication_port = 0\n', "a cluster node needs a fixed port and replication_port"),
    ('[server]\nport = 0\n' + CLUSTER, "a cluster node needs a fixed port and replication_port"),
    ('[cluster]\nleader = "me"\n', "unknown key 'leader' in [cluster]"),
    (CLUSTER + "tls = true\n", "[cluster] tls needs [tls] certfile, keyfile and cacertfile"),
    ('[tls]\ncertfile = "n.pem"\nkeyfile = "n.key"\ncacertfile = "ca.pem"\n' + CLUSTER + "tls = true\n",
     "[cluster] tls needs [management] tls: the API requests nodes forward to each other carry their clients' "
     "credentials"),
])
def test_bad_cluster_settings_are_refused_by_name(tmp_path, text, message):
    path = tmp_path / "warren.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(path)


def test_a_secret_file_is_read_at_start_and_refused_by_name_when_it_cannot_be_used(tmp_path):
    secret = tmp_path / "cluster.secret"
    path = tmp_path / "warren.toml"
    path.write_text(CLUSTER + f'secret_file = "{secret}"\n')
    with pytest.raises(ConfigError, match=re.escape(f"cannot read cluster secret_file {secret}: No such file")):
        load_config(path)
    secret.write_text("  a secret every node holds  \n")
    secret.chmod(0o644)
    with pytest.raises(ConfigError, match=re.escape(f"cluster secret_file {secret} may be read by other users (mode "
                                                    "0644): make it its owner's alone (chmod 600)")):
        load_config(path)
    secret.chmod(0o600)
    secret.write_text("too short\n")
    with pytest.raises(ConfigError, match=re.escape(f"cluster secret_file {secret} holds 9 characters: a secret "
                                                    "needs 16 at least")):
        load_config(path)
    secret.write_bytes(b"\xff" * 20)
    with pytest.raises(ConfigError, match="is not UTF-8 text"):
        load_config(path)
    secret.write_text("  a secret every node holds  \n")
    assert load_config(path).cluster_secret_file == str(secret)
    assert read_secret(str(secret)) == "a secret every node holds"


@pytest.mark.parametrize("text, message", [
    ('[server]\nport = "abc"\n', "port must be an integer, got 'abc'"),
    ("[server]\nport = 70000\n", "port"),
])
def test_a_bad_value_in_the_file_is_refused_though_an_option_overrides_it(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, text), {"port": 5673})


def test_a_vhost_may_be_pinned_to_a_worker_that_the_command_line_gives(tmp_path):
    path = write(tmp_path, '[[vhosts]]\nname = "v"\nworker = 1\n')
    assert load_config(path, {"workers": 2}).vhosts == [{"name": "v", "worker": 1}]
    with pytest.raises(ConfigError, match="worker 1 does not exist: workers are numbered from 0 to 0"):
        load_config(path)


def test_the_command_line_gives_the_management_and_metrics_addresses_apart_from_the_amqp_one():
    args = parse_args(["--host", "0.0.0.0", "--management-host", "0.0.0.0", "--prometheus-host", "10.0.0.1"])
    config = load_config(args.config, config_overrides(args, {}))
    assert (config.host, config.management_host, config.prometheus_host) == ("0.0.0.0", "0.0.0.0", "10.0.0.1")
    alone = parse_args(["--host", "0.0.0.0"])  # (the API stays on loopback unless asked: it takes logins)
    assert load_config(alone.config, config_overrides(alone, {})).management_host == "127.0.0.1"
