"""The store's format version, kept in ``data_dir/format`` so that a later version can tell what it reads.

1. the first format (no ``format`` file): definitions as JSON with tagged values (``records.LEGACY_DEFINITION``).
2. definitions in the typed format (``records.DEFINITION``); everything of format 1 is still read.
3. the broker's keys of several names (a queue's vhost and name) escaped (``broker.model.keys``): the records are
   those of format 2, and the broker moves a format 2 data dir's keys at its first start (``broker.model.upgrade``).
4. definitions of the kind "parameter" (runtime parameters: a shovel's); everything of format 3 is still read.

An older data dir is marked current at the first start (its old records stay readable). A version newer than this
code knows is refused: its records may mean what this code cannot tell (a version before 3 would take the keys of
format 3 for other queues' and drop their messages).
"""

from __future__ import annotations

from pathlib import Path

from storage.segments import write_durably

FORMAT_FILE = "format"
CURRENT = 4  # the version this code writes
_FIRST = 1  # what a data dir without a format file holds


class UnsupportedFormat(Exception):
    """The data dir was written by a store format this version cannot read; the text says what to do."""


def check_and_mark(data_dir: Path) -> int:
    """The data dir's format version (before this start); raise UnsupportedFormat for one this code cannot read.
    Leaves ``data_dir/format`` saying ``CURRENT``."""
    path = data_dir / FORMAT_FILE
    try:
        text = path.read_text(encoding="ascii")
    except FileNotFoundError:
        found = _FIRST
    except (OSError, UnicodeDecodeError) as error:
        raise UnsupportedFormat(f"cannot read the store format of data dir {data_dir} ({path}): {error}") from None
    else:
        if not text.strip().isdigit():
            raise UnsupportedFormat(f"{path} does not hold a store format version (found {text[:40]!r}); "
                                    f"refusing to start rather than misread data dir {data_dir}")
        found = int(text)
    if found > CURRENT:
        raise UnsupportedFormat(f"data dir {data_dir} has store format {found}, written by a newer Warren; this "
                                f"version reads formats up to {CURRENT}: refusing to start (run the newer version)")
    if found != CURRENT:
        write_durably(path, f"{CURRENT}\n")
    return found
