"""What every command line of elmo_tf shares: one-line errors, exit codes, SIGTERM handling, argparse types.

The contract of each CLI (training/*.py, export/*.py, `python -m elmo_tf ...`):
    - a usage error (a bad flag value, a missing file, an output that cannot be written) prints one line
      `prog: error: --flag: what is wrong` on stderr and exits 2;
    - a data error (a malformed input file, a weight file that does not fit) prints one line naming the
      argument, the file and, for text data, the line, and exits 1;
    - SIGTERM is turned into `SystemExit(143)` so `finally` blocks remove temporary files, as Ctrl-C does
      (exit 130); a `kill -9` leaves temporaries that the next run removes (`elmo_tf.io.atomic`);
    - no traceback for any of these. An unexpected exception is a bug: it keeps its traceback.

Example:
    def main(argv=None):
        parser = ArgumentParser(prog="tool.py")
        parser.add_argument("--input", required=True, type=existing_file("--input"))
        args = parser.parse_args(argv)
        try:
            rows = read(args.input)
        except MyFormatError as e:
            raise DataError(f"--input: {e}") from None
        ...

    if __name__ == "__main__":
        sys.exit(run(main))
"""

import argparse
import dataclasses
import functools
import os
import signal
import sys
import threading
import time

from elmo_tf.backend import use_tensorflow_backend
from elmo_tf.bounds import INT32_MAX, INT64_MAX, SEED_MAX, Bounds
from elmo_tf.errors import ElmoTFError, check_int, not_a_regular_file, one_line  # noqa: F401 (check_int: re-exported for the commands)

USAGE_EXIT = 2
DATA_EXIT = 1
SIGTERM_EXIT = 128 + signal.SIGTERM
INTERRUPT_EXIT = 130
MAX_THREADS = 1024  # --threads: TensorFlow starts them all at once (100,000 hung here)


class UsageError(Exception):
    """A bad command line (flag value, missing file, unwritable output): exit 2. The message names the flag."""


class DataError(Exception):
    """Input data that cannot be used (format, encoding, mismatched weights): exit 1. The message names the
    flag, the file and, for text data, the line."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse with a one-line error (`prog: error: ...`, exit 2) instead of the usage text + error."""

    def error(self, message):
        self.exit(USAGE_EXIT, f"{self.prog}: error: {message}\n")


# True from the handler's SystemExit until a finalizer swallows it (`_raise_sigterm_again`) or `handle_sigterm` resets
_sigterm = {"unwinding": False}
RESEND_WAIT_S = 10  # the most the resending thread waits for the main thread to leave the hook


def _in_the_hook(frame):
    """Whether `frame` runs inside `_raise_sigterm_again` (a signal handler runs between any two bytecodes)."""
    while frame is not None:
        if frame.f_code is _raise_sigterm_again.__code__:
            return True
        frame = frame.f_back
    return False


def _send_sigterm_out_of_the_hook(main_thread_id):
    """Sends SIGTERM once the main thread has left `_raise_sigterm_again`: sent while the hook still runs (a busy
    machine may hold the main thread there for milliseconds), its handler would run in the hook, where an exception
    is only printed ("Exception ignored in sys.unraisablehook") and the command would go on and exit 0."""
    deadline = time.monotonic() + RESEND_WAIT_S
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(main_thread_id)
        if frame is None:
            return  # the main thread ended: nothing is left to interrupt
        if not _in_the_hook(frame):
            break
        del frame
        time.sleep(0.001)
    os.kill(os.getpid(), signal.SIGTERM)


def _resend_sigterm():
    threading.Thread(
        target=_send_sigterm_out_of_the_hook,
        args=(threading.main_thread().ident,),
        daemon=True,
        name="elmo_tf-sigterm-resend",
    ).start()


def _raise_sigterm(signum, frame):
    if _sigterm["unwinding"]:
        return  # its SystemExit is unwinding the stack: the finally blocks clean up undisturbed
    if _in_the_hook(frame):
        _resend_sigterm()  # raised here, it would be printed and lost: sent again once the hook has returned
        return
    _sigterm["unwinding"] = True
    raise SystemExit(SIGTERM_EXIT)


def _raise_sigterm_again(unraisable, previous):
    """A `sys.unraisablehook`. The handler's `SystemExit(143)` raised inside a finalizer (a `__del__` or weakref
    callback that the garbage collector ran; TensorFlow's objects have many) cannot leave it: Python reports it as
    "Exception ignored" and goes on, and the command would finish and exit 0. So SIGTERM is sent again from another
    thread once this hook has returned (`_send_sigterm_out_of_the_hook`), and its handler runs out of that finalizer
    (or, landing in another, is sent again). Every other unraisable exception goes to `previous`."""
    error = unraisable.exc_value
    if isinstance(error, SystemExit) and error.code == SIGTERM_EXIT and _sigterm["unwinding"]:
        _sigterm["unwinding"] = False
        _resend_sigterm()
    else:
        previous(unraisable)


def handle_sigterm():
    """SIGTERM raises `SystemExit(143)` in the main thread, once, so `finally` blocks and context managers clean up; a
    SIGTERM that lands inside a finalizer is not lost (`_raise_sigterm_again`)."""
    _sigterm["unwinding"] = False
    signal.signal(signal.SIGTERM, _raise_sigterm)
    if getattr(sys.unraisablehook, "func", None) is not _raise_sigterm_again:
        sys.unraisablehook = functools.partial(_raise_sigterm_again, previous=sys.unraisablehook)


def run(main, argv=None, prog=None):
    """Calls `main(argv)` with the CLI contract above; returns the exit status for `sys.exit`."""
    prog = prog or os.path.basename(sys.argv[0] or "elmo_tf")
    handle_sigterm()
    try:
        use_tensorflow_backend()  # the commands are TensorFlow's, whatever a JAX or PyTorch user's KERAS_BACKEND says
        return main(argv)
    except UsageError as e:
        print(f"{prog}: error: {one_line(e)}", file=sys.stderr)
        return USAGE_EXIT
    except DataError as e:
        print(f"{prog}: error: {one_line(e)}", file=sys.stderr)
        return DATA_EXIT
    except ElmoTFError as e:  # the library's one error base: data the command cannot use (the message names it)
        print(f"{prog}: error: {one_line(e)}", file=sys.stderr)
        return DATA_EXIT
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return INTERRUPT_EXIT
    except BrokenPipeError:  # `... | head`: the reader went away; not an error of ours
        try:
            sys.stdout = open(os.devnull, "w")  # keeps the interpreter's final flush quiet
        except OSError:
            pass
        return DATA_EXIT
    except Exception as e:
        if raised_by_sigterm(e):  # SIGTERM's exit, masked while unwinding (see raised_by_sigterm)
            return SIGTERM_EXIT
        raise


def raised_by_sigterm(error):
    """Whether `error` was raised while SIGTERM's `SystemExit(143)` unwound the stack: a context manager that raises
    in its `__exit__` (TensorFlow's device scope, when the signal lands inside `tf.saved_model.save`) replaces the
    exit with its own error, whose `__context__` chain still holds it. The `finally` blocks have run either way."""
    while error is not None:
        if isinstance(error, SystemExit) and error.code == SIGTERM_EXIT:
            return True
        error = error.__context__
    return False


def number_type(name, bounds):
    """An argparse `type` parsing an int or a float (`bounds.kind`) within `bounds` (`elmo_tf.config.Bounds`); the
    error names the flag and the value received, and says the bound it breaks."""

    def parse(text):
        try:
            value = bounds.kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be {'an integer' if bounds.kind is int else 'a number'}, got {text!r}"
            ) from None
        broken = bounds.requirement(value)
        if broken:
            raise argparse.ArgumentTypeError(f"{name} {broken}, got {text!r}")
        return value

    parse.bounds = bounds
    return parse


def bounded_number(name, kind=int, minimum=None, maximum=None, minimum_inclusive=True, maximum_inclusive=True):
    """An argparse `type` parsing `kind` (int, or a finite float) within bounds; the error names the flag and the
    value."""
    return number_type(name, Bounds(kind, minimum, maximum, not minimum_inclusive, not maximum_inclusive))


def positive_int(name, maximum=None):
    """An argparse `type` accepting integers >= 1 (and <= `maximum`); the error names the flag and the value."""
    return bounded_number(name, int, minimum=1, maximum=maximum)


def size_int(name, minimum=1):
    """An argparse `type` for a size (a batch, a dimension, a token count): an int from `minimum` to int32's
    largest, as TensorFlow takes it."""
    return bounded_number(name, int, minimum=minimum, maximum=INT32_MAX)


def count_int(name, minimum=0):
    """An argparse `type` for a count (steps, epochs, trials, sentences): an int from `minimum` to int64's largest."""
    return bounded_number(name, int, minimum=minimum, maximum=INT64_MAX)


def seed_int(name, minimum=0):
    """An argparse `type` for a random seed: an int in numpy's range, `minimum` <= seed < 2**32."""
    return bounded_number(name, int, minimum=minimum, maximum=SEED_MAX)


def threads_int(name):
    """An argparse `type` for TensorFlow's thread counts: 0 (TensorFlow's default) to `MAX_THREADS`."""
    return number_type(name, Bounds(int, 0, MAX_THREADS, high_note="TensorFlow starts every thread at once"))


def field_type(config_class, field):
    """The argparse `type` of the flag of `config_class`'s field (an `elmo_tf.bounds.config_field` with `Bounds`):
    the same range as the dataclass checks, the error naming the field's flag."""
    spec = next(f for f in dataclasses.fields(config_class) if f.name == field)
    return number_type(spec.metadata["flag"], spec.metadata["bounds"])


def existing_file(name):
    """An argparse `type`: a path to an existing regular file."""

    def parse(text):
        what = not_a_regular_file(text)
        if what:
            raise argparse.ArgumentTypeError(f"{name}: {what}: {text!r}")
        return text

    return parse


def existing_dir(name):
    """An argparse `type`: a path to an existing directory."""

    def parse(text):
        if not os.path.isdir(text):
            raise argparse.ArgumentTypeError(f"{name}: not a directory: {text!r}")
        return text

    return parse


def check_output_file(flag, path, inputs=()):
    """Raises `UsageError` unless `path` can be written as a file: its directory exists (a directory, not a file) and
    is writable, it is not a directory nor an existing read-only file, and it is not (a link to) one of `inputs`
    (`(flag, path)` pairs). Checked before any work; each message says which of these it is."""
    if os.path.isdir(path):
        raise UsageError(f"{flag}: is a directory: {path!r}")
    if isinstance(path, str) and path.endswith(tuple(sep for sep in (os.sep, os.altsep) if sep)):
        raise UsageError(f"{flag}: {path!r} ends with a separator, as a directory would; give a file name")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        if os.path.exists(parent):
            raise UsageError(f"{flag}: {parent!r} is not a directory, so {path!r} cannot be written in it")
        raise UsageError(f"{flag}: the directory {parent!r} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{flag}: the directory {parent!r} is not writable")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise UsageError(f"{flag}: {path!r} is read-only; make it writable or give another file")
    for input_flag, input_path in inputs:
        if input_path and os.path.exists(path) and os.path.exists(input_path) and os.path.samefile(path, input_path):
            raise UsageError(f"{flag}: {path!r} is the same file as {input_flag} {input_path!r}; it would be destroyed")


def glob_flag(flag, pattern):
    """The files a glob flag (`--train`) matches, sorted; UsageError naming the flag when none match."""
    from elmo_tf.io.vocabulary import expand_glob

    try:
        return expand_glob(pattern)
    except ValueError as e:
        raise UsageError(f"{flag}: {e}") from None


def check_output_dir(flag, path):
    """Raises `UsageError` unless `path` is a directory or can be created as one (its nearest existing ancestor is
    a writable directory). Checked before any work."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"{flag}: exists and is not a directory: {path!r}")
    ancestor = os.path.abspath(path)
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor) or not os.access(ancestor, os.W_OK):
        raise UsageError(f"{flag}: cannot create or write {path!r} ({ancestor!r} is not a writable directory)")


def check_text_file(flag, path, require_tokens=False):
    """Raises `DataError` naming `flag`, the file and the line unless `path` reads as lines of text: no UTF-16/UTF-32
    byte order mark, no NUL byte (a binary file), at least one line (with `require_tokens`, one holding a token).
    Invalid UTF-8 is allowed: the readers of these files (the embedder, the LM data) keep bytes as they are.
    Returns the number of lines. Checked before any work; `path` is already known to be a file."""
    from elmo_tf.io.text import TextFileError, count_lines

    try:
        lines, with_tokens = count_lines(path)
    except TextFileError as e:
        raise DataError(f"{flag}: {e}") from None
    if not lines:
        raise DataError(f"{flag}: {path}: the file is empty")
    if require_tokens and not with_tokens:
        raise DataError(f"{flag}: {path}: no tokens (all {lines} lines are blank)")
    return lines


def check_text_start(flag, path, head=1 << 16):
    """`check_text_file` for a file that is then read once as a stream: only its first `head` bytes are checked here
    (empty, only a UTF-8 byte order mark, a UTF-16/UTF-32 byte order mark, a NUL byte); the reader finds the rest
    (`elmo_tf.io.text.raw_lines` names the line). Raises `DataError` naming `flag` and the file."""
    import codecs

    from elmo_tf.io.text import TextFileError, raw_lines

    with open(path, "rb") as f:
        start = f.read(head)
    if start in (b"", codecs.BOM_UTF8):
        raise DataError(f"{flag}: {path}: the file is empty")
    try:  # the same checks and messages as the full reader, on the first lines
        for _number, offset, line in raw_lines(path):
            if offset + len(line) >= head:
                break
    except TextFileError as e:
        raise DataError(f"{flag}: {e}") from None


def setup_logging(verbose=False, quiet=False, fmt="%(levelname)s %(message)s"):
    """Logging of a CLI to stderr: INFO (DEBUG with `verbose`, WARNING with `quiet`), each line once.

    TensorFlow's own logger ("tensorflow") gets a handler of its own when TF is imported before logging is set up,
    and also passes its records to the root logger: every TF line ("Assets written to: ...") would print twice. It is
    made to stop at its own handler. It and absl's logger stay at WARNING unless `verbose` (their INFO lines are noise
    in a CLI).
    """
    import logging

    level = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    logging.basicConfig(level=level, format=fmt, stream=sys.stderr)
    for name in ("tensorflow", "absl"):  # absl: TF's checkpoint code logs "Sharding callback duration" at INFO
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.WARNING)
    tf_logger = logging.getLogger("tensorflow")
    if tf_logger.handlers:
        tf_logger.propagate = False
