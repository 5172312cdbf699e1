"""warrenctl without a server: parsing the command line, rabbitmqctl's output formats, exit codes and the reasons
the management API gives. Under test: warrenctl.parser, warrenctl.output, warrenctl.client, warrenctl.__main__."""

from __future__ import annotations

import http.server
import io
import socket
import threading

import pytest

from warrenctl import output
from warrenctl.__main__ import main
from warrenctl.client import _refusal
from warrenctl.commands import VERBS
from warrenctl.errors import EX_DATAERR, EX_NOPERM, EX_UNAVAILABLE, EX_USAGE
from warrenctl.parser import parse


@pytest.fixture(autouse=True)
def no_environment(monkeypatch):
    for variable in ("WARREN_MANAGEMENT_URL", "WARREN_MANAGEMENT_USER", "WARREN_MANAGEMENT_PASSWORD"):
        monkeypatch.delenv(variable, raising=False)


def test_defaults_are_rabbitmqctls_and_the_local_api():
    args = parse(["list_queues"])
    assert (args.url, args.api_user, args.api_password) == ("http://127.0.0.1:15672", "guest", "guest")
    assert (args.vhost, args.columns, args.quiet, args.formatter, args.no_table_headers) == (
        "/", ["name", "messages"], False, "table", False)
    assert parse(["list_bindings"]).columns == ["source_name", "source_kind", "destination_name",
                                                "destination_kind", "routing_key", "arguments"]
    assert parse(["list_users", "user,tags"]).columns == ["user", "tags"]


def test_dash_p_is_the_vhost_and_common_options_go_before_or_after_the_verb():
    before = parse(["-q", "--port", "15999", "--username", "ops", "list_queues", "-p", "v1", "name", "consumers"])
    after = parse(["list_queues", "-p", "v1", "name", "consumers", "-q", "--port", "15999", "--username", "ops"])
    for args in (before, after):
        assert (args.vhost, args.columns, args.quiet) == ("v1", ["name", "consumers"], True)
        assert (args.url, args.api_user) == ("http://127.0.0.1:15999", "ops")


def test_environment_names_the_api_and_the_credentials(monkeypatch):
    monkeypatch.setenv("WARREN_MANAGEMENT_URL", "http://10.0.0.9:8080")
    monkeypatch.setenv("WARREN_MANAGEMENT_USER", "ops")
    monkeypatch.setenv("WARREN_MANAGEMENT_PASSWORD", "s3cret")
    args = parse(["status"])
    assert (args.url, args.api_user, args.api_password) == ("http://10.0.0.9:8080", "ops", "s3cret")
    assert parse(["status", "--host", "h", "--password", "p"]).url == "http://h:15672"
    assert parse(["status", "--password", "p"]).api_password == "p"


def test_a_verbs_username_and_password_are_not_the_apis_credentials():
    args = parse(["add_user", "alice", "pw", "--username", "admin", "--password", "adminpw"])
    assert (args.username, args.password, args.api_user, args.api_password) == ("alice", "pw", "admin", "adminpw")


def test_verb_options():
    policy = parse(["set_policy", "-p", "v", "dlx", "^q", '{"max-length":1}', "--priority", "3",
                    "--apply-to", "queues"])
    assert (policy.vhost, policy.name, policy.pattern, policy.priority, policy.apply_to) == ("v", "dlx", "^q", 3,
                                                                                           "queues")
    assert parse(["set_policy", "p", ".*", "{}"]).apply_to == "all"
    delete = parse(["delete_queue", "q", "-u", "-e"])
    assert (delete.if_unused, delete.if_empty) == (True, True)
    assert parse(["set_user_tags", "alice"]).tags == []


@pytest.mark.parametrize("argv, expected", [
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["add_user", "alice"], "the following arguments are required: PASSWORD"),
    (["delete_user", "a", "b"], "unrecognized arguments: b"),
    (["set_policy", "p", ".*", "{}", "--priority", "high"], "invalid int value: 'high'"),
    (["list_queues", "name,bogus", "nope"], "Info key(s) bogus,nope are not supported"),
    ([], "the following arguments are required: VERB"),
])
def test_usage_errors_exit_64_with_one_error_line_and_the_usage(argv, expected, capsys):
    assert main(argv) == EX_USAGE
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"Error: {expected}" or (err[0].startswith("Error: ") and expected in err[0])
    assert err[1].startswith("usage: warrenctl")


@pytest.mark.parametrize("argv, expected", [
    (["status", "--port", "99999"], "argument --port: not a port number: '99999'"),
    (["status", "--timeout", "0"], "argument -t/--timeout: not a positive number of seconds: '0'"),
    (["status", "-t", "soon"], "argument -t/--timeout: not a positive number of seconds: 'soon'"),
])
def test_bad_option_values_are_usage_errors(argv, expected, capsys):
    assert main(argv) == EX_USAGE
    assert capsys.readouterr().err.splitlines()[0] == f"Error: {expected}"


def test_a_url_without_its_scheme_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.setenv("WARREN_MANAGEMENT_URL", "localhost:15672")
    assert main(["status"]) == EX_USAGE
    assert capsys.readouterr().err == \
        "Error: the management API's URL must start with http:// or https://, got 'localhost:15672'\n"


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_every_verb_has_help(verb, capsys):
    assert main([verb, "--help"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: warrenctl {verb}") and VERBS[verb].summary in " ".join(text.split())
    assert main(["help", verb]) == 0
    assert capsys.readouterr().out == text


def test_help_lists_every_verb(capsys):
    assert main(["help"]) == 0
    text = capsys.readouterr().out
    assert all(verb in text for verb in VERBS)
    assert "64 usage" in text and "69 API unreachable" in text


def test_an_unreachable_api_exits_69(capsys):
    with socket.socket() as sock:  # a port nothing listens on: bound but never listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        assert main(["list_queues", "-q", "--port", str(port)]) == EX_UNAVAILABLE
    assert capsys.readouterr().err == (f"Error: cannot reach the management API at http://127.0.0.1:{port}: "
                                       "Connection refused\n")


def test_a_table_has_a_header_row_and_tab_separated_cells():
    out = io.StringIO()
    output.table(["name", "messages", "durable"], [["q1", 3, True], ["q2", 0, False]], True, out)
    assert out.getvalue() == "name\tmessages\tdurable\nq1\t3\ttrue\nq2\t0\tfalse\n"
    out = io.StringIO()
    output.table(["name"], [["q1"]], False, out)
    assert out.getvalue() == "q1\n"


def test_an_empty_table_prints_nothing_not_even_headers():
    out = io.StringIO()
    output.table(["name", "messages"], [], True, out)
    assert out.getvalue() == ""


def test_cells_as_rabbitmqctl_prints_them():
    assert output.cell(["monitoring", "management"]) == "[monitoring, management]"
    assert output.cell([]) == "[]"
    assert output.cell({}) == "[]"
    assert output.cell({"x-dead-letter-exchange": "dlx", "x-max-length": 5}) == \
        '[{"x-dead-letter-exchange","dlx"},{"x-max-length",5}]'
    assert output.cell({"capabilities": {"basic.nack": True}}) == '[{"capabilities",[{"basic.nack",true}]}]'
    assert output.cell(None) == ""
    assert output.cell("") == ""


def test_json_rows_are_rabbitmqctls_one_object_per_line():
    out = io.StringIO()
    output.json_rows(["user", "tags"], [["alice", ["monitoring"]], ["guest", ["administrator"]]], out)
    assert out.getvalue() == ('[\n{"user":"alice","tags":["monitoring"]}\n'
                              ',{"user":"guest","tags":["administrator"]}\n]\n')
    out = io.StringIO()
    output.json_rows(["name"], [], out)
    assert out.getvalue() == "[\n]\n"


def test_the_apis_refusals_become_one_line_and_an_exit_code():
    policy = _refusal(400, {"error": "bad_request", "reason":
                      "Validation failed\n\n[{&lt;&lt;\"bogus\"&gt;&gt;,1}] are not recognised policy settings\n"})
    assert (policy.message, policy.exit_code) == (
        'Validation failed [{<<"bogus">>,1}] are not recognised policy settings', EX_DATAERR)
    regexp = _refusal(400, {"error": "bad_request",
                      "reason": ["invalid_regexp", [40], [[109, 105, 115, 115, 105, 110, 103, 32, 41], 1]]})
    assert regexp.message == '["invalid_regexp", "(", ["missing )", 1]]'
    login = _refusal(401, {"error": "not_authorized", "reason": "Login failed"})
    assert (login.message, login.exit_code) == ("refused by the management API: Login failed", EX_NOPERM)
    tags = _refusal(401, {"error": "not_authorised", "reason": "Not administrator user"})
    assert (tags.message, tags.exit_code) == ("refused by the management API: Not administrator user", EX_NOPERM)
    assert _refusal(500, {"error": "internal", "reason": "boom"}).exit_code == 70


class StubApi(http.server.BaseHTTPRequestHandler):
    """Answers every GET with the status and body set for its path (404 for any other path)."""

    answers: dict[str, tuple[int, bytes]] = {}

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        status, body = self.answers.get(self.path, (404, b'{"error":"Object Not Found","reason":"Not Found"}'))
        self.send_response(status)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def stub_api():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StubApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], StubApi.answers
    server.shutdown()
    server.server_close()
    StubApi.answers.clear()


def test_a_missing_endpoint_is_named_not_taken_for_a_missing_vhost(stub_api, capsys):
    port, answers = stub_api
    answers["/api/vhosts/%2F"] = (200, b'{"name":"/"}')
    assert main(["list_consumers", "-q", "--port", str(port)]) == EX_UNAVAILABLE
    assert capsys.readouterr().err == \
        f"Error: the management API at http://127.0.0.1:{port} has no /api/consumers/%2F\n"
    assert main(["list_queues", "-q", "-p", "gone", "--port", str(port)]) == EX_DATAERR
    assert capsys.readouterr().err == "Error: Virtual host 'gone' does not exist\n"


def test_an_answer_that_is_not_the_apis_is_one_error_line(stub_api, capsys):
    port, answers = stub_api
    answers["/api/users"] = (200, b"<html>not an API</html>")
    assert main(["list_users", "-q", "--port", str(port)]) == EX_UNAVAILABLE
    assert capsys.readouterr().err.startswith(f"Error: bad answer from the management API at http://127.0.0.1:{port}")
    answers["/api/users"] = (200, b'{"not": "a list"}')
    assert main(["list_users", "-q", "--port", str(port)]) == 70
    assert capsys.readouterr().err.startswith("Error: unexpected answer from the management API")
    answers["/api/users"] = (503, b"busy")
    assert main(["list_users", "-q", "--port", str(port)]) == 70
    assert capsys.readouterr().err == "Error: the management API answered 503: busy\n"
