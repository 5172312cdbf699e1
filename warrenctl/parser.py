"""The command line: rabbitmqctl's verbs and flags, plus where the management API is and who calls it."""

from __future__ import annotations

import argparse
import os
from typing import Any

from warrenctl.commands import VERBS, Verb
from warrenctl.listings import LISTINGS
from warrenctl.errors import UsageError

DEFAULT_URL = "http://127.0.0.1:15672"
DEFAULTS: dict[str, Any] = {  # the common options' values when neither the command line nor the environment sets them
    "host": None, "port": None, "timeout": 60.0, "quiet": False, "formatter": "table", "no_table_headers": False,
}
ENVIRONMENT = {  # option -> the environment variable that gives its default, and the default without it
    "api_user": ("WARREN_MANAGEMENT_USER", "guest"),
    "api_password": ("WARREN_MANAGEMENT_PASSWORD", "guest"),
    "url": ("WARREN_MANAGEMENT_URL", DEFAULT_URL),
    "cacert": ("WARREN_MANAGEMENT_CACERT", None),
}
EPILOG = ("The management API is at --host/--port (default 127.0.0.1:15672), or at $WARREN_MANAGEMENT_URL; "
          "credentials are --username/--password, or $WARREN_MANAGEMENT_USER/$WARREN_MANAGEMENT_PASSWORD "
          "(default guest/guest). -p is the virtual host, as in rabbitmqctl. Exit codes: 0 done, 64 usage, "
          "65 bad data or unknown virtual host, 67 unknown user, 69 API unreachable or object not found, "
          "70 failure or already exists, 75 timeout, 77 credentials refused or not allowed.")


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors exit 64 (rabbitmqctl's code) instead of argparse's 2."""

    verb_parsers: dict[str, Parser]  # the top-level parser's sub-parser of each verb, by name

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message, self.format_usage().strip())


def port_number(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}")
    return int(text)


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"not a positive number of seconds: {text!r}")
    return value


def common_options() -> argparse.ArgumentParser:
    """Options every verb takes, before or after the verb (SUPPRESS: an unset option never hides a set one)."""
    common = Parser(add_help=False, argument_default=argparse.SUPPRESS)
    group = common.add_argument_group("connection and output")
    group.add_argument("--host", help="host of the management API (default 127.0.0.1)")
    group.add_argument("--port", type=port_number, help="port of the management API (default 15672)")
    group.add_argument("--username", dest="api_user", metavar="USER", help="user to call the API as (default guest)")
    group.add_argument("--password", dest="api_password", metavar="PASSWORD",
                       help="that user's password (default guest)")
    group.add_argument("--cacert", metavar="FILE", help="the CA certificates (PEM) an https:// API's certificate is "
                       "checked against, besides the system's ($WARREN_MANAGEMENT_CACERT)")
    group.add_argument("-t", "--timeout", type=seconds, help="seconds to wait for each answer (default 60)")
    group.add_argument("-q", "--quiet", action="store_true", help="print results only, no informational lines")
    group.add_argument("--formatter", choices=("table", "json"), help="output format (default table)")
    group.add_argument("--no-table-headers", action="store_true", help="tables without their header row")
    return common


def build() -> Parser:
    common = common_options()
    parser = Parser(prog="warrenctl", parents=[common], epilog=EPILOG,
                    description="rabbitmqctl's verbs over Warren's (or RabbitMQ's) management HTTP API.")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=Parser)
    verbs.required = True
    parser.verb_parsers = {name: add_verb(verbs, name, spec, common) for name, spec in VERBS.items()}
    helper = verbs.add_parser("help", help="shows a verb's usage", parents=[common])
    helper.add_argument("topic", nargs="?", choices=sorted(VERBS), metavar="VERB")
    return parser


def add_verb(verbs: Any, name: str, spec: Verb, common: argparse.ArgumentParser) -> Parser:
    description = f"{spec.summary}. {spec.details}" if spec.details else spec.summary
    sub = verbs.add_parser(name, help=spec.summary, description=description, parents=[common], epilog=EPILOG)
    for argument in spec.arguments:
        if argument.endswith("..."):
            sub.add_argument(argument.removesuffix("..."), nargs="*", metavar=argument.removesuffix("...").upper())
        elif argument.endswith("?"):  # (one that may be left out)
            sub.add_argument(argument.removesuffix("?"), nargs="?", metavar=argument.removesuffix("?").upper())
        else:
            sub.add_argument(argument, metavar=argument.upper())
    if spec.per_vhost:
        sub.add_argument("-p", "--vhost", default="/", help="the virtual host (default /)")
    for option in spec.options:
        sub.add_argument(*option.flags, **option.settings)
    return sub


def parse(argv: list[str]) -> argparse.Namespace:
    """The parsed command line with every common option set (a usage error raises UsageError)."""
    parser = build()
    args = parser.parse_args(argv)
    if args.verb in LISTINGS:
        args.columns = listing_columns(args.columns, args.verb, parser.verb_parsers[args.verb])
    for name, value in DEFAULTS.items():
        if not hasattr(args, name):
            setattr(args, name, value)
    for name, (variable, default) in ENVIRONMENT.items():
        if getattr(args, name, None) is None:
            setattr(args, name, os.environ.get(variable) or default)
    if args.host is not None or args.port is not None:
        args.url = f"http://{args.host or '127.0.0.1'}:{args.port or 15672}"
    if not args.url.startswith(("http://", "https://")):
        raise UsageError(f"the management API's URL must start with http:// or https://, got {args.url!r}")
    return args


def listing_columns(given: list[str], verb: str, parser: Parser) -> list[str]:
    """The columns named ("name messages" or "name,messages"), or the listing's defaults; unknown ones are refused."""
    listing = LISTINGS[verb]
    columns = [column for argument in given for column in argument.split(",") if column]
    unknown = [column for column in columns if column not in listing.columns]
    if unknown:
        parser.error(f"Info key(s) {','.join(unknown)} are not supported")
    return columns or list(listing.defaults)


def verb_help(topic: str | None) -> str:
    """`warrenctl help VERB`: the verb's help, or the list of verbs."""
    parser = build()
    return parser.format_help() if topic is None else parser.verb_parsers[topic].format_help()
