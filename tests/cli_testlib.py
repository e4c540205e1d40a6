"""Running a command line of elmo_tf in a subprocess and checking the `elmo_tf.cli` contract: exit status, ONE
error line on stderr naming the flag / file / line, no traceback.

TensorFlow's C++ runtime logs a few lines while it is imported (absl's "All log messages before
absl::InitializeLog()", oneDNN and CUDA notices), whatever TF_CPP_MIN_LOG_LEVEL says; `own_lines` leaves those
out, so what remains is everything the command itself wrote.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

_TF_NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|[IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [\w.]+:\d+\] "
    r"|To enable the following instructions: )"
)


def run_command(args, timeout=300, cwd=REPO_ROOT, stdin=subprocess.DEVNULL):
    """`[sys.executable, *args]` run to completion; returns the CompletedProcess (text)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run(
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
