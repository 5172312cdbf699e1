"""The warrenctl console script."""

from __future__ import annotations

import os
import sys

from warrenctl.client import Client
from warrenctl.commands import VERBS, Context
from warrenctl.errors import EX_OK, EX_SOFTWARE, CommandError, UsageError
from warrenctl.parser import parse, verb_help


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse(sys.argv[1:] if argv is None else argv)
        if args.verb == "help":
            sys.stdout.write(verb_help(args.topic))
            return EX_OK
        client = Client(args.url, args.api_user, args.api_password, args.timeout, args.cacert)
        context = Context(client, args.quiet, args.formatter == "json", not args.no_table_headers)
        VERBS[args.verb].run(context, args)
    except SystemExit as done:  # --help printed its text
        return done.code if isinstance(done.code, int) else EX_OK
    except UsageError as error:
        print(f"Error: {error.message}", file=sys.stderr)
        if error.usage:
            print(error.usage, file=sys.stderr)
        return error.exit_code
    except CommandError as error:
        print(f"Error: {error.message}", file=sys.stderr)
        return error.exit_code
    except (AttributeError, KeyError, TypeError) as error:  # an answer without the shape of RabbitMQ's API
        print(f"Error: unexpected answer from the management API ({type(error).__name__}: {error})",
              file=sys.stderr)
        return EX_SOFTWARE
    except BrokenPipeError:  # the reader went away (| head): stop quietly, as a filter does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except KeyboardInterrupt:
        return 130
    return EX_OK


if __name__ == "__main__":
    sys.exit(main())
