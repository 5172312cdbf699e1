"""warrenctl's errors and exit codes (rabbitmqctl's, which are sysexits.h's)."""

EX_OK = 0
EX_USAGE = 64  # bad command line: unknown verb, option or column, wrong number of arguments
EX_DATAERR = 65  # bad input: a value the broker refused, an unreadable file, an unknown virtual host
EX_NOUSER = 67  # the named user does not exist
EX_UNAVAILABLE = 69  # the management API cannot be reached, or the named object does not exist (as rabbitmqctl)
EX_SOFTWARE = 70  # the broker failed, or the object already exists (as rabbitmqctl's add_user)
EX_TEMPFAIL = 75  # the broker did not answer in time
EX_NOPERM = 77  # the credentials were refused, or the user's tags do not allow the call


class CommandError(Exception):
    """A command failed: `message` is the one line shown to the user, `exit_code` the process's exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


class UsageError(CommandError):
    """The command line is wrong; `usage` is the verb's usage line, shown under the message."""

    def __init__(self, message: str, usage: str = "") -> None:
        super().__init__(message, EX_USAGE)
        self.usage = usage
