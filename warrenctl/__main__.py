"""The warrenctl console script."""

import sys


def main(argv: list[str] | None = None) -> int:
    print("warrenctl: not implemented yet", file=sys.stderr)
    return 64


if __name__ == "__main__":
    sys.exit(main())
