"""elmo_tf/cli.py: the output and text-input checks the command lines share (in process; the commands
themselves are run in tests/cli/test_*_errors.py)."""

import os
import pathlib

import pytest

from elmo_tf.cli import DataError, UsageError, check_output_file, check_text_file


def usage_error(*args, **kwargs):
    with pytest.raises(UsageError) as info:
        check_output_file(*args, **kwargs)
    return str(info.value)


def test_output_file_checks(tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("x\n")
    check_output_file("--output", str(tmp_path / "new.txt"), inputs=[("--input", str(source))])
    assert usage_error("--output", str(tmp_path) + os.sep) == f"--output: is a directory: '{tmp_path}{os.sep}'"
    message = usage_error("--output", str(tmp_path / "nope") + os.sep)
    assert (
        message
        == f"--output: '{tmp_path / 'nope'}{os.sep}' ends with a separator, as a directory would; give a file name"
    )
    assert "does not exist" in usage_error("--output", str(tmp_path / "nope" / "x.txt"))
    hard = tmp_path / "hard.txt"
    os.link(source, hard)
    assert "same file as --input" in usage_error("--output", str(hard), inputs=[("--input", str(source))])
    check_output_file("--output", tmp_path / "path-object.txt")  # a Path is accepted too


def test_text_file_checks(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes(b"a b\n\ncaf\xe9\nlast")
    assert check_text_file("--input", path) == 4  # invalid UTF-8 is allowed: the readers keep bytes
    path.write_bytes(b" \n\t\n")
    assert check_text_file("--input", path) == 2
    with pytest.raises(DataError, match=r"^--input: .*in\.txt: no tokens \(all 2 lines are blank\)$"):
        check_text_file("--input", path, require_tokens=True)
    path.write_bytes(b"")
    with pytest.raises(DataError, match=r"^--input: .*in\.txt: the file is empty$"):
        check_text_file("--input", path)
    path.write_bytes("a\n".encode("utf-16"))
    with pytest.raises(DataError, match=r"^--input: .*in\.txt:1: starts with a UTF-16/UTF-32 byte order mark"):
        check_text_file("--input", path)


def test_existing_file_says_what_a_path_that_is_not_a_regular_file_is(tmp_path):
    """A FIFO (what `<(zcat x)` gives), a directory or a missing path: the message says which (exit 2 in the CLI)."""
    import argparse

    from elmo_tf.cli import existing_file

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    parse = existing_file("--input")
    for path, what in ((fifo, "is a FIFO"), (tmp_path, "is a directory"), (tmp_path / "nope", "no such file")):
        with pytest.raises(argparse.ArgumentTypeError, match=rf"^--input: {what}\b.*: '{path}'$"):
            parse(str(path))
    r, w = os.pipe()  # an anonymous pipe, as bash's process substitution passes it: /dev/fd/N
    try:
        with pytest.raises(argparse.ArgumentTypeError, match=r"^--input: is a FIFO .*not a regular file: '/dev/fd/"):
            parse(f"/dev/fd/{r}")
    finally:
        os.close(r)
        os.close(w)
    regular = tmp_path / "in.txt"
    regular.write_text("x\n")
    assert parse(str(regular)) == str(regular)


def test_sigterm_masked_by_a_context_manager_still_exits_143_without_a_traceback(capsys):
    """SIGTERM's SystemExit(143), replaced by an error a context manager raises while it unwinds (TensorFlow's device
    scope inside tf.saved_model.save), is still exit 143, quietly; any other error still propagates."""
    from elmo_tf.cli import SIGTERM_EXIT, run

    class Scope:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            raise RuntimeError("Exiting device scope without proper scope nesting")

    def interrupted(argv):
        with Scope():
            raise SystemExit(SIGTERM_EXIT)

    def failing(argv):
        with Scope():
            raise ValueError("not a signal")

    assert run(interrupted, [], prog="x") == SIGTERM_EXIT
    assert capsys.readouterr().err == ""
    with pytest.raises(RuntimeError):
        run(failing, [], prog="x")


def test_masked_sigterm_still_says_where_the_finished_shards_are_kept(tmp_path, caplog):
    """`journaled_run` (embed, score): SIGTERM's exit replaced by a context manager's error on the way out still logs
    where the finished shards are kept, as a plain SIGTERM does (a CI run exited 143 with an empty stderr)."""
    import logging

    from elmo_tf.cli import SIGTERM_EXIT
    from elmo_tf.cli.progress import journaled_run
    from elmo_tf.io.journal import state_dir_of

    class Scope:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            raise RuntimeError("Exiting device scope without proper scope nesting")

    class Progress:
        closed = False

        def close(self):
            self.closed = True

    output = tmp_path / "out.hdf5"
    os.makedirs(state_dir_of(output))
    (pathlib.Path(state_dir_of(output)) / "shard-000000.hdf5").write_bytes(b"")
    log, progress = logging.getLogger("elmo_tf.test"), Progress()
    for raised in (SystemExit(SIGTERM_EXIT), None):
        caplog.clear()
        with pytest.raises(RuntimeError) as error:
            with journaled_run(str(output), log, {}, progress):
                with Scope():
                    if raised:
                        raise raised
        assert progress.closed
        said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        if raised:
            assert isinstance(error.value.__context__, SystemExit)
            assert said == [
                f"the finished shards are kept in {state_dir_of(output)}: the same command with --resume "
                "goes on from them (1 kept)"
            ]
        else:  # a plain error is not an interruption: no hint
            assert said == []


FINALIZER_SIGTERM = """
import os, signal, sys, threading, time
from elmo_tf.cli import run

if sys.argv[1:] == ["slow-thread-start"]:  # a busy machine: the main thread runs again only 50 ms after a start
    start = threading.Thread.start
    def slow_start(self):
        start(self)
        time.sleep(0.05)
    threading.Thread.start = slow_start

class Finalized:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handler runs here, inside the finalizer, and its SystemExit cannot leave it
            pass

def main(argv):
    Finalized()
    began = time.monotonic()
    while time.monotonic() - began < 10:  # the command's work, which SIGTERM ends
        pass
    print("finished", flush=True)
    return 0

sys.exit(run(main, [], prog="x"))
"""


@pytest.mark.parametrize("machine", ["idle", "slow-thread-start"])
def test_sigterm_that_lands_in_a_finalizer_still_exits_143(machine):
    """SIGTERM's SystemExit(143) raised inside a `__del__` (the garbage collector runs TensorFlow's at any bytecode)
    is "ignored" by Python: the signal is sent again, and the command exits 143 while it works, quietly. On a busy
    machine the resent signal must not land while the hook that resends it still runs (CI saw exit 0 and "Exception
    ignored in sys.unraisablehook" when it was sent on a 1 ms timer)."""
    import subprocess
    import sys

    from elmo_tf.cli import SIGTERM_EXIT

    done = subprocess.run(
        [sys.executable, "-c", FINALIZER_SIGTERM, machine], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout, done.stderr) == (SIGTERM_EXIT, "", "")
