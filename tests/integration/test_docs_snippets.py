"""Every snippet of README.md and docs/ works as written, so that the docs cannot drift from the code: Python runs
against a broker the test starts (its ports put in place of the defaults the docs show), TOML is a config file
Warren accepts, and every shell command either runs against that broker (curl, rabbitmqadmin, warrenctl) or names
things that exist (make targets, files, modules). Blocks marked `text` (usage lines, outputs) are shown, not run.
The design memos (docs/design.md, docs/scale-out.md) sketch rather than instruct: their blocks are not checked."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import ssl
import subprocess
import sys
from pathlib import Path

import pika
import pytest

from broker.__main__ import parse_args
from broker.config import Config, load_config
from broker.connection.tls import server_context
from tests.conftest import REPO_ROOT

SKETCHES = {"design.md", "scale-out.md"}
PAGES = [REPO_ROOT / "README.md", *(page for page in sorted((REPO_ROOT / "docs").glob("*.md"))
                                    if page.name not in SKETCHES)]
FENCE = re.compile(r"^```(\S*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
LANGUAGES = {"python", "toml", "sh", "text", "yaml"}
DEFAULT_PORTS = {"5672": "port", "15672": "management_port", "15692": "prometheus_port",  # the docs show these
                 "1883": "mqtt_port"}
TOOLS = {"curl", "rabbitmqadmin", "warrenctl", "warren-perf"}  # shell commands run against the test's broker
SNIPPET_TIMEOUT = 180  # seconds; a Spark snippet starts a JVM


def blocks(language: str | None = None) -> list[tuple[str, str]]:
    """(page name, code) of every fenced block, of one language when given."""
    return [(page.name, code) for page in PAGES for tag, code in FENCE.findall(page.read_text())
            if language is None or tag == language]


def with_broker_ports(code: str, broker) -> str:
    """The code with the broker's ports where the docs show the defaults (127.0.0.1:5672, -P 15672...)."""
    def port(match: re.Match) -> str:
        return str(getattr(broker, DEFAULT_PORTS[match.group(0)]))
    return re.sub(r"(?<![0-9])(?:15672|15692|5672|1883)(?![0-9])", port, code)


def test_every_block_says_what_it_is():
    untagged = [(page, code.splitlines()[0] if code else "") for page in PAGES
                for tag, code in FENCE.findall(page.read_text()) if tag not in LANGUAGES]
    assert untagged == []


@pytest.mark.parametrize("page, code", blocks("toml"), ids=lambda value: value[:40])
def test_a_toml_snippet_is_a_config_warren_accepts(page, code, tmp_path):
    path = tmp_path / "warren.toml"
    path.write_text(code)
    load_config(path)


def test_the_prometheus_scrape_config_names_the_metrics_port():
    [(_, code)] = blocks("yaml")
    assert f'"127.0.0.1:{load_config().prometheus_port}"' in code


@pytest.mark.parametrize("page", sorted({page for page, _ in blocks("python")}))
def test_the_python_of_a_page_runs_against_the_broker(page, broker, tmp_path):
    """A page's Python blocks run one after the other, as one script (a later one may use what an earlier one
    made), in a directory of their own."""
    code = "\n".join(code for name, code in blocks("python") if name == page)
    if "pyspark" in code:
        if shutil.which("java") is None:
            pytest.skip("the Spark snippets need a Java runtime (java not found on PATH)")
        pytest.importorskip("pyspark", reason="the Spark snippets need the spark extra")
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                                             os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-c", with_broker_ports(code, broker)], cwd=tmp_path,
                            env=environment, capture_output=True, text=True, timeout=SNIPPET_TIMEOUT)
    assert result.returncode == 0, result.stderr[-3000:]
    EFFECTS[page](broker, tmp_path, result.stdout)


def printed_hello(broker, directory: Path, output: str) -> None:
    assert output == "b'Hello, Warren!'\n"


def spark_wrote(broker, directory: Path, output: str) -> None:
    """The queue pipeline published the order upper-cased; the stream's events are in Parquet files."""
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as connection:
        channel = connection.channel()
        _, _, body = channel.basic_get("orders.upper", auto_ack=True)
        for queue in ("orders", "orders.upper", "events"):
            channel.queue_delete(queue)
    assert body == b"TWO PEARS"
    assert list(directory.glob("events/batch=*/*.parquet"))


def mqtt_went_both_ways(broker, directory: Path, output: str) -> None:
    """The MQTT subscriber got its own publishes and the AMQP one; the AMQP queue got an MQTT one, with its headers
    (the subscriber's lines and the AMQP consumer's come from two threads: in either order)."""
    assert sorted(output.splitlines()) == [
        "sensors.room2.temperature b'19.0' {'x-mqtt-dup': False, 'x-mqtt-publish-qos': 1}",
        "sensors/room1/temperature b'21.5'",
        "sensors/room2/temperature b'19.0'",
        "sensors/room3/temperature b'20.0'"]


# what each page's Python is seen to do
EFFECTS = {"README.md": printed_hello, "spark.md": spark_wrote, "mqtt.md": mqtt_went_both_ways}


def commands(code: str) -> list[list[str]]:
    """The commands of a shell block: its lines without comments, each split as the shell would, leading
    VARIABLE=value assignments left out, a trailing & dropped."""
    found = []
    for line in code.splitlines():
        words = shlex.split(line, comments=True)
        while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
            words.pop(0)
        if words and words[-1] == "&":
            words.pop()
        if words:
            found.append(words)
    return found


SHELL_COMMANDS = [(page, words) for page, code in blocks("sh") for words in commands(code)]


@pytest.mark.parametrize("page, words", SHELL_COMMANDS, ids=lambda value: " ".join(value)[:50]
                         if isinstance(value, list) else value)
def test_a_shell_command_runs_or_names_what_exists(page, words, broker, tmp_path):
    program, arguments = words[0], words[1:]
    if program in TOOLS:
        if program == "rabbitmqadmin" and shutil.which("rabbitmqadmin") is None:
            pytest.skip("rabbitmqadmin comes with Debian's rabbitmq-server package, not installed here")
        executable = shutil.which(program) or str(Path(sys.executable).parent / program)
        result = subprocess.run([executable, *(with_broker_ports(word, broker) for word in arguments)],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
    elif program == "make":
        targets = set(re.findall(r"^([a-z][a-z-]*):", (REPO_ROOT / "Makefile").read_text(), re.MULTILINE))
        assert set(word for word in arguments if "=" not in word) <= targets
    elif program.endswith("/python"):
        if arguments[0] == "-m":
            module = arguments[1].replace(".", "/")
            assert arguments[1] == "pytest" or (REPO_ROOT / f"{module}.py").exists() or (REPO_ROOT / module).is_dir()
        else:
            assert (REPO_ROOT / arguments[0]).is_file()
        assert all((REPO_ROOT / word).exists() for word in arguments if word.startswith("tests/"))
    elif program == "warren-server":  # started here it would keep the default ports: its options are checked
        parse_args(arguments)
    elif program == "docker":
        assert (REPO_ROOT / arguments[arguments.index("-f") + 1]).is_file()
    elif program.startswith("tools/"):
        assert os.access(REPO_ROOT / program, os.X_OK)
    elif program == "openssl":  # (a recipe for certificates: it makes them, in a folder of the test's own)
        if shutil.which("openssl") is None:
            pytest.skip("openssl is not installed")
        result = subprocess.run(words, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        if (tmp_path / "server.pem").exists():  # what it made is a certificate Warren takes, and a client trusts
            server_context(Config(tls_certfile=str(tmp_path / "server.pem"), tls_keyfile=str(tmp_path / "server.key")))
            ssl.create_default_context(cafile=str(tmp_path / "server.pem"))
    else:
        assert program == "apt-get", f"{page}: no check for {program!r}"
