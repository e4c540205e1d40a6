"""The one error base of elmo_tf, and the small checks that raise it.

Every error the library raises about what a caller gave it (a file, a value, a config field, a request)
is an `ElmoTFError`; it carries what it names, so a command line can name the flag without parsing the
message. The command-line code (`elmo_tf.cli`) maps this one base to its exit codes; the library never
imports the command-line code.
"""

import operator
import os
import stat

__all__ = ["ElmoTFError", "check_int", "not_a_regular_file", "one_line"]


class ElmoTFError(ValueError):
    """An input elmo_tf cannot use. The message is one line and names the thing; the attributes say it again.

    Args:
        message: what is wrong, with the value received.
        key: the argument, config field or dataset the error is about (e.g. `"batch_size"`), or None.
        path: the file the error is about, or None.
        line: the 1-based line of `path`, for text data, or None.
    """

    key = path = line = None  # also for subclasses that keep another base's constructor (WriteError: OSError)

    def __init__(self, message, *, key=None, path=None, line=None):
        super().__init__(message)
        self.key = key
        self.path = path
        self.line = line


def one_line(text):
    """`text` with every run of whitespace (newlines included) made one space."""
    return " ".join(str(text).split())


_KINDS = (
    (stat.S_ISDIR, "is a directory"),
    (stat.S_ISFIFO, "is a FIFO (a named or anonymous pipe), not a regular file"),
    (stat.S_ISCHR, "is a character device, not a regular file"),
    (stat.S_ISBLK, "is a block device, not a regular file"),
    (stat.S_ISSOCK, "is a socket, not a regular file"),
)


def not_a_regular_file(path):
    """None when `path` is (a link to) a regular file; otherwise what it is instead, for a message: "no such file",
    "is a directory", "is a FIFO (...), not a regular file", ... Reading a FIFO or a device as a file blocks or
    misreads, so callers refuse them before opening."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return "no such file"
    if stat.S_ISREG(mode):
        return None
    return next((text for test, text in _KINDS if test(mode)), "is not a regular file")


def check_int(name, value, minimum, allow_none=False, maximum=None):
    """`value` as an int, or ElmoTFError "`name` must be [None or ]an int >= `minimum`, got `value`" (with `maximum`:
    "an int in [`minimum`, `maximum`]"; bools, floats and strings refused). For library arguments;
    `elmo_tf.cli.positive_int` is the argparse twin."""
    if value is None and allow_none:
        return None
    prefix = "None or " if allow_none else ""
    if (
        isinstance(value, bool)
        or not hasattr(value, "__index__")
        or operator.index(value) < minimum
        or (maximum is not None and operator.index(value) > maximum)
    ):
        within = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ElmoTFError(f"{name} must be {prefix}an int {within}, got {value!r}", key=name)
    return operator.index(value)
