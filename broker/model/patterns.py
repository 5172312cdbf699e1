"""Regular expressions users supply (permission patterns, policy and operator policy patterns, the API's listing
filters), run by RE2. RE2's matching time is linear in the name matched, whatever the pattern, so no pattern can
stall the event loop as a backtracking engine does with `^(a+)+$` (Python's re: days for a 40-character name;
RabbitMQ's PCRE stops at a match limit). RE2 does not run look-arounds or back-references: a pattern that uses them
is refused with a message saying so, as is one that would compile to a program too big to match quickly."""

from __future__ import annotations

import re._constants as sre
import re._parser as sre_parse

import re2

# The most RE2 instructions a pattern may compile to: a match against a 255-byte name then costs at most about a
# millisecond (the worst measured: 1 ms at 1,000 instructions, 0.4 ms at 2,000), and compiling it about 5 ms.
MAX_PROGRAM_SIZE = 2000
MAX_PATTERN_LENGTH = 4 * MAX_PROGRAM_SIZE  # longer patterns are refused before they are parsed at all


class PatternError(ValueError):
    """A pattern refused: its text says why, for the user who wrote it."""


def _options(ignore_case: bool) -> re2.Options:
    options = re2.Options()
    options.log_errors = False  # a refused pattern is the user's error, reported to them, not RE2's log line
    options.never_capture = True  # only whether a name matches is asked, which RE2's DFA answers fastest
    options.case_sensitive = not ignore_case
    return options


_OPTIONS = {False: _options(False), True: _options(True)}


class _EveryName:
    """What a pattern every name matches compiles to: RE2's search through its Python wrapper takes about 3 µs (a
    third of a queue.declare, where the usual permission is ".*")."""

    __slots__ = ()

    def search(self, name: str) -> bool:
        return True


EVERY_NAME = _EveryName()
UNIVERSAL = frozenset(("", ".*", "^"))  # patterns that match at the start of any name, a newline's included


def compile_pattern(pattern: str, ignore_case: bool = False):
    """pattern compiled by RE2, to be searched anywhere in a name (as RabbitMQ's re:run); PatternError when it is
    not one RE2 can run quickly; re.error (with the message and position PCRE-like texts need) when it is not a
    regular expression at all."""
    if pattern in UNIVERSAL:
        return EVERY_NAME
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise PatternError(f"pattern is {len(pattern)} characters long; at most {MAX_PATTERN_LENGTH} are allowed")
    parsed = sre_parse.parse(pattern)  # re.error for a malformed pattern, in the words callers report
    if _estimated_size(parsed) > MAX_PROGRAM_SIZE:  # checked first: RE2 takes long to compile huge repetitions
        raise _too_big()
    try:
        compiled = re2.compile(pattern, _OPTIONS[ignore_case])
    except re2.error as error:
        reason = error.args[0].decode(errors="replace") if error.args and isinstance(error.args[0], bytes) else error
        raise PatternError(f"pattern cannot be matched in linear time ({reason}): look-arounds and "
                           "back-references are not supported") from None
    if compiled.programsize > MAX_PROGRAM_SIZE:
        raise _too_big()
    return compiled


def _too_big() -> PatternError:
    return PatternError(f"pattern is too complex: it would compile to more than {MAX_PROGRAM_SIZE} steps "
                        "(large counted repetitions such as {1,1000} expand into copies)")


def _estimated_size(parsed) -> int:
    """About how many RE2 instructions a parsed pattern compiles to: a counted repetition {m,n} expands into n
    copies of what it repeats. Stops counting once past MAX_PROGRAM_SIZE."""
    size = 0
    for op, value in parsed:
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
            low, high, item = value
            copies = low + 1 if high == sre.MAXREPEAT else max(high, 1)
            size += copies * (_estimated_size(item) + 1)
        elif op is sre.SUBPATTERN:
            size += _estimated_size(value[-1])
        elif op is sre.BRANCH:
            size += sum(_estimated_size(branch) + 1 for branch in value[1])
        else:
            size += 1
        if size > MAX_PROGRAM_SIZE:
            break
    return size

