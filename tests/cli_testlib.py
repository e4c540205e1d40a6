"""Running a command line of elmo_tf in a subprocess and checking the `elmo_tf.cli` contract: exit status, ONE
error line on stderr naming the flag / file / line, no traceback.

TensorFlow's C++ runtime logs a few lines while it is imported (absl's "All log messages before
absl::InitializeLog()", oneDNN and CUDA notices), whatever TF_CPP_MIN_LOG_LEVEL says; `own_lines` leaves those
out, so what remains is everything the command itself wrote.
"""

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

import forked

REPO_ROOT = Path(__file__).resolve().parents[1]

_TF_NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|[IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [\w.]+:\d+\] "
    r"|To enable the following instructions: )"
)


def run_command(args, timeout=300, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, fresh=False):
    """`[sys.executable, *args]` run to completion, forked from the worker's fork server (`forked.run`), or in a fresh
    interpreter when `fresh` (to see what a command imports); returns the CompletedProcess (text)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return (subprocess.run if fresh else forked.run)(
        [sys.executable, *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=stdin,
    )


def own_lines(stderr):
    """The lines of `stderr` written by the command, not by TensorFlow's C++ runtime."""
    return [line for line in stderr.splitlines() if line.strip() and not _TF_NOISE.match(line)]


def assert_one_error(result, status, *needles):
    """`result` exited with `status` after writing exactly one line (besides TensorFlow's) holding "error:" and
    every one of `needles`, and no traceback. Returns that line."""
    lines = own_lines(result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == status, (result.returncode, result.stderr)
    assert len(lines) == 1, result.stderr
    assert "error:" in lines[0], lines[0]
    for needle in needles:
        assert str(needle) in lines[0], (needle, lines[0])
    return lines[0]


def limit_file_size(nbytes):
    """A `preexec_fn` for subprocess: files of the child may not grow beyond `nbytes` (RLIMIT_FSIZE), and SIGXFSZ is
    ignored, so a write past the limit fails with EFBIG ("File too large"), as a write to a full disk fails with
    ENOSPC. Reading, and the parent's files, are not limited. TensorFlow's C++ writers (SaveV2) meet it too."""

    def limit():
        import resource
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))

    limit.fork_request = {"file_size": nbytes}  # what the fork server applies instead (tests/forkserver.py)
    return limit


@contextlib.contextmanager
def file_size_limit(nbytes):
    """`limit_file_size` for this process, within the block: the soft limit only (the hard one stays, so it is raised
    again at the end), SIGXFSZ ignored meanwhile."""
    import resource
    import signal

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def run_limited(args, file_size, timeout=300, cwd=REPO_ROOT, stdout=subprocess.PIPE):
    """`run_command` under `limit_file_size(file_size)`; `stdout` may be an open file (itself limited then)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return forked.run(
        [sys.executable, *map(str, args)],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=timeout,
        preexec_fn=limit_file_size(file_size),
    )


def assert_ends_with_one_error(result, status, *needles):
    """`result` exited with `status`, its stderr's last line is the only one holding "error:" and holds every one of
    `needles`; no traceback, no "Exception ignored" (log lines and a progress bar may come before). Returns that
    line."""
    lines = [line for text in own_lines(result.stderr) for line in text.split("\r") if line.strip()]
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr, result.stderr[-5000:]
    assert result.returncode == status, (result.returncode, result.stderr[-5000:])
    errors = [line for line in lines if "error:" in line]
    assert errors == lines[-1:], result.stderr[-5000:]
    for needle in needles:
        assert str(needle) in errors[0], (needle, errors[0])
    return errors[0]
