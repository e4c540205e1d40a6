"""Killing a journaled command (`python -m elmo_tf embed` / `score`) at chosen points and resuming it, in real
processes (forked from the worker's fork server: `forked`): the driver of tests/embed/test_run_resume.py and
tests/embed/test_score_resume.py.

`ELMO_TF_FAULT="<point>:<k>:<SIGNAL>"` (elmo_tf/io/journal.py) makes the run send itself SIGNAL the k-th time it passes
a point: "batch" (a batch written into the shard being built), "shard-write" (a shard whole in its temporary, not yet
renamed), "shard" (a shard just committed), "manifest" (the manifest's temporary written, not renamed), "merge" (the
output's temporary holding k shards), "merged" (the output renamed, the journal not yet removed).

Each test module gives the driver its own `run(output, *extra, fault=None)`: the command on the module's model and
input with `extra` flags, run to completion by `run_elmo_tf` (stderr captured as text); and `assert_same(output)`:
`output` is exactly the uninterrupted run's.
"""

import os
import re
import signal
import subprocess
import sys

import forked
from cli_testlib import REPO_ROOT, assert_one_error, own_lines

from elmo_tf.io.journal import FAULT_ENV, state_dir_of

WAIT = 120  # seconds, the bound on every subprocess
PREVIOUS = b"an older output that must survive\n" * 64
SIGNALLED = {"SIGKILL": -signal.SIGKILL, "SIGTERM": 143, "SIGINT": 130}  # the exit status after each signal
RESUMED = re.compile(r"(\d+) of (\d+) shards resumed")
ALL = None  # in a chain: every shard of the run is on disk
KILLED_WRITING = ("batch", "shard-write", "merge")  # the points at which a kill -9 leaves its temporary


def _env(fault=None):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop(FAULT_ENV, None)
    if fault:
        env[FAULT_ENV] = fault
    return env


def _argv(command, args):
    return [sys.executable, "-m", "elmo_tf", command, *map(str, args)]


def run_elmo_tf(command, args, fault=None):
    """`python -m elmo_tf COMMAND ARGS...` run to completion (at most `WAIT` s) under `fault` (none: the variable
    removed); returns the CompletedProcess, its stderr as text."""
    return forked.run(
        _argv(command, args),
        cwd=REPO_ROOT,
        env=_env(fault),
        preexec_fn=forked.default_sigint,  # a runner started with SIGINT ignored passes that on
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=WAIT,
    )


def start_elmo_tf(command, args, stderr=subprocess.DEVNULL):
    """`python -m elmo_tf COMMAND ARGS...` started without a fault (a Popen: to be killed from outside, or read
    through a terminal given as `stderr`)."""
    return forked.Popen(
        _argv(command, args),
        cwd=REPO_ROOT,
        env=_env(),
        preexec_fn=forked.default_sigint,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
    )


def shards(output):
    """The finished shards in the journal of `output`, by name."""
    state = state_dir_of(output)
    return sorted(name for name in os.listdir(state) if name.startswith("shard-")) if os.path.isdir(state) else []


def temporaries(directory):
    """Every temporary under `directory` (beside the output and in its journal)."""
    return sorted(p.name for p in directory.rglob("*") if ".tmp-" in p.name)


def resumed(result):
    """(resumed shards, shards) from the run's last log line."""
    found = RESUMED.findall(result.stderr)
    assert found, result.stderr[-3000:]
    return tuple(int(n) for n in found[-1])


def uninterrupted(run, output):
    """The uninterrupted run into `output`, with a progress line after every batch (stderr is a pipe): it succeeds,
    leaves no journal and has at least 6 shards. Returns (its result, its shard count)."""
    result = run(output, "--log-interval", "0.001")
    assert result.returncode == 0, result.stderr[-3000:]
    assert not os.path.exists(state_dir_of(output))
    done, total = resumed(result)
    assert done == 0 and total >= 6
    return result, total


def assert_interrupted(result, fault, output):
    """`result` is a run stopped by `fault`: the signal's exit status, no traceback, and unless killed with -9 the
    line saying where the finished shards are kept and how to go on."""
    assert result.returncode == SIGNALLED[fault.rsplit(":", 1)[1]], (fault, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    if "SIGKILL" not in fault:  # SIGTERM, Ctrl-C: the run says where its work is and how to go on
        assert f"finished shards are kept in {state_dir_of(output)}: the same command with --resume" in (
            result.stderr
        ), result.stderr[-3000:]


def kill_and_resume(run, output, chain, total, assert_same):
    """Runs `chain` (`(fault, shards on disk right after it: at least, or ALL)`, each run but the first with
    --resume) into `output`, which holds an older file first, then --resume once more: after every interruption the
    older output is unchanged (until "merged"), the finished shards are kept and no temporary is left but a kill -9's
    own; the last run resumes all `total` shards (the chain ends after the output is written) and writes exactly the
    uninterrupted run's output, leaving no journal and no temporary."""
    assert chain[-1][0].startswith("merged:"), chain[-1]
    directory = output.parent
    output.write_bytes(PREVIOUS)
    for k, (fault, at_least) in enumerate(chain):
        result = run(output, *(["--resume"] if k else []), fault=fault)
        assert_interrupted(result, fault, output)
        if not fault.startswith("merged"):
            assert output.read_bytes() == PREVIOUS, fault  # an older output survives every interruption
        assert len(shards(output)) >= (total if at_least is ALL else at_least), (fault, shards(output))
        left = temporaries(directory)
        if "SIGKILL" in fault and fault.split(":")[0] in KILLED_WRITING:
            assert len(left) == 1, (fault, left)  # the killed run's own temporary, nothing else
        else:
            assert left == [], (fault, left)
    result = run(output, "--resume")
    assert result.returncode == 0, result.stderr[-3000:]
    assert resumed(result) == (total, total)
    assert_same(output)
    assert temporaries(directory) == [] and not os.path.exists(state_dir_of(output))


def refused_then_resumed(run, output, refuse, needles, assert_same):
    """A run killed with -9 just after its second shard; `refuse()` (the same command with --resume and other
    settings) exits 2 with one line naming --resume, `output`, each of `needles` and how to start over, and changes
    nothing; then the same command with --resume finishes from those two shards. Returns the refusal's line."""
    killed = run(output, fault="shard:2:SIGKILL")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    before = shards(output)
    assert len(before) == 2, before
    line = assert_one_error(refuse(), 2, "--resume", str(output), "run without --resume")
    for needle in needles:
        assert needle in line, (needle, line)
    assert shards(output) == before and not output.exists()  # the refused run changed nothing
    result = run(output, "--resume")  # the partial run is still good
    assert result.returncode == 0, result.stderr[-3000:]
    assert resumed(result)[0] == 2
    assert_same(output)
    return line


def assert_progress_lines(result, name, lines_in_input):
    """`result`'s stderr (not a terminal) holds at least 3 progress lines "NAME: done/total sentences (share%),
    rate sentences/s, ETA h:mm:ss" with growing counts, and no bar."""
    lines = [line for line in own_lines(result.stderr) if f"{name}: " in line and "sentences/s" in line]
    assert len(lines) >= 3, result.stderr[-3000:]
    numbers = [int(re.search(rf"{name}: (\d+)/{lines_in_input} sentences", line).group(1)) for line in lines]
    assert numbers == sorted(numbers) and 0 < numbers[0] < lines_in_input
    assert all(re.search(r"\(\d+\.\d%\), \d+\.\d sentences/s, ETA \d+:\d\d:\d\d", line) for line in lines), lines
    assert "\r" not in result.stderr  # no bar redrawn into a log file


def assert_quiet(run, output, assert_same):
    """With --quiet the run prints nothing (even with a log interval of 1 ms) and writes the same output."""
    result = run(output, "--quiet", "--log-interval", "0.001")
    assert result.returncode == 0, result.stderr
    assert own_lines(result.stderr) == []
    assert_same(output)
