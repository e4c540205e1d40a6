"""`python -m elmo_tf embed --resume` after kill -9, SIGTERM and Ctrl-C at chosen points, in real subprocesses.

The points are reached deterministically (tests/resume_testlib.py: `ELMO_TF_FAULT="<point>:<k>:<SIGNAL>"` makes the
run send itself SIGNAL the k-th time it passes a point of `elmo_tf.embed.embed_file`; "shard-write" is embed's
journal being written). One more run is killed from outside at whatever moment a shard appears. After each
interruption the older output is unchanged and no temporary is left but the killed one's own; then `--resume` must
write exactly the uninterrupted run's file: the same dataset names, every dataset bitwise equal with the same dtype,
the same `sentence_to_index` string. A resume whose settings or input differ is refused with one line naming each
difference and both values; a run without `--resume` starts over and removes the partial state. Progress: log lines
when stderr is not a terminal, a bar with total and ETA on a terminal (a pty), nothing with `--quiet`.
"""

import fcntl
import functools
import os
import pty
import random
import re
import select
import struct
import termios
import time

import h5py
import numpy as np
import pytest
from resume_testlib import (
    ALL,
    SIGNALLED,
    WAIT,
    assert_progress_lines,
    assert_quiet,
    kill_and_resume,
    refused_then_resumed,
    resumed,
    run_elmo_tf,
    shards,
    start_elmo_tf,
    temporaries,
    uninterrupted,
)
from tiny_models import TINY

from elmo_tf.config import BiLMConfig
from elmo_tf.io.journal import state_dir_of
from elmo_tf.models import ELMo, save_elmo

FLAGS = ("--batch-size", "8", "--shard-tokens", "1500")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A saved tiny biLM (seeded random weights) and an input of 1,000 lines (about 12 shards of 1,500 tokens):
    random words, empty lines, repeated lines (sentence_to_index keeps the last), long lines."""
    d = tmp_path_factory.mktemp("embed_resume")
    model = ELMo(BiLMConfig(**TINY))
    rng = np.random.default_rng(3)
    for weight in model.weights:
        weight.assign(rng.normal(0, 0.3, size=tuple(weight.shape)).astype("float32"))
    save_elmo(model, d / "model")
    words = "the cat sat on a mat and ran far away from home quickly naïve café 日本語 , .".split()
    pick = random.Random(5)
    lines = []
    for k in range(1000):
        if k % 37 == 0:
            lines.append("")
        elif k % 23 == 0 and lines:
            lines.append(lines[pick.randrange(len(lines))])
        else:
            lines.append(" ".join(pick.choice(words) for _ in range(pick.randint(1, 60 if k % 50 == 0 else 25))))
    (d / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return d


def embed_argv(files, output, *extra, input=None):
    model = files / "model"
    args = ["--options", model / "options.json", "--weights", model / "weights.hdf5"]
    args += ["--input", input or files / "in.txt", "--output", output, *FLAGS, *extra]
    return [str(a) for a in args]


def run_embed(files, output, *extra, fault=None, input=None):
    return run_elmo_tf("embed", embed_argv(files, output, *extra, input=input), fault=fault)


def read_all(path):
    """{name: array} of every dataset, and the raw sentence_to_index string."""
    with h5py.File(path, "r") as f:
        index = f["sentence_to_index"][0]
        arrays = {name: f[name][...] for name in f if name != "sentence_to_index"}
    return arrays, index


def assert_identical(path, reference):
    arrays, index = read_all(path)
    expected, expected_index = reference
    assert index == expected_index
    assert sorted(arrays) == sorted(expected)
    for name, array in expected.items():
        assert arrays[name].dtype == array.dtype and arrays[name].shape == array.shape, name
        assert np.array_equal(arrays[name], array), name  # bitwise: -0.0 == 0.0 aside, no NaN in these


@pytest.fixture(scope="module")
def reference(files, tmp_path_factory):
    """The uninterrupted run's output, its result (progress lines: stderr is a pipe) and its shard count."""
    out = tmp_path_factory.mktemp("reference") / "out.hdf5"
    result, total = uninterrupted(functools.partial(run_embed, files), out)
    return read_all(out), result, total


def same_as(reference):
    return functools.partial(assert_identical, reference=reference[0])


# ---------------------------------------------------------------- kills at chosen points, then --resume

# (fault, shards on disk right after it: at least); each run but the first with --resume
CHAIN = [
    ("batch:6:SIGKILL", 1),  # a shard and a half done: the half is lost
    ("shard-write:1:SIGTERM", 1),  # while the journal (a shard) is written: its temporary removed, older ones kept
    ("shard-write:2:SIGKILL", 2),  # the same under kill -9: its temporary left, removed by the next run
    ("shard:1:SIGINT", 3),  # Ctrl-C just after a shard is committed: it is kept
    ("merge:2:SIGKILL", ALL),  # every shard done, the output's temporary half built
    ("merge:3:SIGTERM", ALL),
    ("merged:1:SIGKILL", ALL),  # the output in place, the journal not yet removed
]


@pytest.mark.slow
def test_kills_at_chosen_points_then_resume_give_the_uninterrupted_output(files, reference, tmp_path):
    kill_and_resume(functools.partial(run_embed, files), tmp_path / "out.hdf5", CHAIN, reference[2], same_as(reference))


@pytest.mark.parametrize(
    "fault",
    [
        "manifest:1:SIGKILL",
        pytest.param("shard-write:3:SIGKILL", marks=pytest.mark.slow),
        pytest.param("batch:10:SIGTERM", marks=pytest.mark.slow),
        pytest.param("shard:2:SIGINT", marks=pytest.mark.slow),
    ],
)
def test_one_kill_then_resume(files, reference, tmp_path, fault):
    """A kill from a fresh start (the chain above starts there once); the resumed run keeps exactly the finished
    shards. Killed while the manifest is written, there is nothing to resume: the run starts over. The others are
    opt-in (-m slow): each costs two TensorFlow start-ups."""
    output = tmp_path / "out.hdf5"
    killed = run_embed(files, output, fault=fault)
    assert killed.returncode == SIGNALLED[fault.rsplit(":", 1)[1]], killed.stderr[-3000:]
    assert not output.exists()
    kept = len(shards(output))
    result = run_embed(files, output, "--resume")
    assert result.returncode == 0, result.stderr[-3000:]
    assert resumed(result) == (kept, reference[2])
    if fault.startswith("manifest"):
        assert kept == 0 and "nothing to resume" in result.stderr
    assert_identical(output, reference[0])
    assert temporaries(tmp_path) == [] and not os.path.exists(state_dir_of(output))


@pytest.mark.slow
def test_a_kill_from_outside_at_any_moment(files, reference, tmp_path):
    """kill -9 from another process as soon as three shards exist (wherever the run then is), then --resume."""
    output = tmp_path / "out.hdf5"
    process = start_elmo_tf("embed", embed_argv(files, output))
    try:
        deadline = time.monotonic() + WAIT
        while len(shards(output)) < 3 and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        process.kill()
    finally:
        process.wait(WAIT)
    result = run_embed(files, output, "--resume")
    assert result.returncode == 0, result.stderr[-3000:]
    assert resumed(result)[0] >= 3
    assert_identical(output, reference[0])


# ---------------------------------------------------------------- refused resumes, starting over


def test_a_resume_that_differs_is_refused_naming_each_difference(files, reference, tmp_path):
    output = tmp_path / "out.hdf5"
    other = tmp_path / "other.txt"
    other.write_bytes((files / "in.txt").read_bytes().replace(b"cat", b"dog", 1))
    extra = ("--resume", "--layers", "top", "--dtype", "float16", "--shard-tokens", "1000", "--precision", "bfloat16")
    extra += ("--quiet",)  # a bfloat16 model may log (INFO) how this CPU rounds bfloat16 before the refusal's line
    needles = (
        '--layers: "all" then, "top" now',
        '--dtype: "float32" then, "float16" now',
        "--shard-tokens: 1500 then, 1000 now",
        '--precision: "float32" then, "bfloat16" now',  # issue 51: across precisions, both named
        "--input: sha256",
    )
    line = refused_then_resumed(
        functools.partial(run_embed, files),
        output,
        lambda: run_embed(files, output, *extra, input=other),
        needles,
        same_as(reference),
    )
    assert str(files / "in.txt") in line and str(other) in line  # the input named by its path, both times
    assert "--batch-size" not in line and "--options/--weights" not in line  # what is the same is not named


def test_a_run_without_resume_starts_over_and_removes_the_partial_state(files, reference, tmp_path):
    output = tmp_path / "out.hdf5"
    killed = run_embed(files, output, fault="shard:3:SIGTERM")
    assert killed.returncode == 143 and len(shards(output)) == 3
    result = run_embed(files, output)
    assert result.returncode == 0, result.stderr[-3000:]
    assert resumed(result)[0] == 0
    assert_identical(output, reference[0])
    assert not os.path.exists(state_dir_of(output)) and temporaries(tmp_path) == []


# ---------------------------------------------------------------- progress


def test_progress_lines_when_stderr_is_not_a_terminal(reference):
    assert_progress_lines(reference[1], "embed", 1000)


def test_quiet_prints_nothing(files, reference, tmp_path):
    assert_quiet(functools.partial(run_embed, files), tmp_path / "out.hdf5", same_as(reference))


def test_progress_bar_with_total_and_eta_on_a_terminal(files, tmp_path):
    output = tmp_path / "out.hdf5"
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # 24 x 120, as a terminal window
    process = start_elmo_tf("embed", embed_argv(files, output), stderr=slave)
    os.close(slave)
    chunks = []
    try:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif process.poll() is not None:
                break
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(WAIT)
        os.close(master)
    text = b"".join(chunks).decode("utf-8", "replace")
    assert process.returncode == 0, text[-3000:]
    assert "1000/1000" in text, text[-3000:]  # the total is known
    bars = re.findall(r"embed:\s+\d+%\|[^\r\n]*\| *\d+/1000 \[[0-9:]+<[0-9:?]+, *[0-9.?]+ *sent/s\]", text)
    assert bars, text[-3000:]  # elapsed<ETA and the rate, as tqdm shows them
