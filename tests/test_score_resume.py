"""`python -m elmo_tf score --resume` after kill -9 and SIGTERM at chosen points, in real subprocesses.

As tests/test_embed_resume.py does for embed: `ELMO_TF_FAULT="<point>:<k>:<SIGNAL>"` (elmo_tf/io/journal.py) makes the
run send itself SIGNAL the k-th time it passes a point of `elmo_tf.score.score_file`: "batch" (a batch written into
the shard being built), "shard-write" (a shard whole in its temporary, not yet renamed), "shard" (a shard just
committed), "merge" (the output's temporary holding k shards), "merged" (the output renamed, the journal not yet
removed). After each interruption an older output is unchanged; `--resume` then writes exactly the uninterrupted
run's bytes. A resume whose input, softmax, vocabulary or --top-k differs is refused naming each (exit 2). Progress:
log lines when stderr is not a terminal, nothing with `--quiet`.
"""

import os
import random
import re
import signal
import subprocess
import sys

import h5py
import pytest
from cli_testlib import REPO_ROOT, assert_one_error, own_lines
from tiny_models import TINY, randomize_weights

from elmo_tf.config import BiLMConfig
from elmo_tf.io.journal import FAULT_ENV, state_dir_of
from elmo_tf.io.vocabulary import Vocabulary
from elmo_tf.models import BiLMPretrainer
from elmo_tf.pretraining import write_model_dir

WAIT = 120  # seconds, the bound on every subprocess
WORDS = ["<S>", "</S>", "<UNK>"] + "the cat sat on a mat dog ran far away . ,".split()
PREVIOUS = b"an older output that must survive\n" * 16
FLAGS = ("--batch-size", "8", "--shard-tokens", "300", "--top-k", "2")
RESUMED = re.compile(r"(\d+) of (\d+) shards resumed")
SIGNALLED = {"SIGKILL": -signal.SIGKILL, "SIGTERM": 143}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny biLM with random weights (a pretraining run dir) and 300 lines: words in and out of the vocabulary,
    empty lines, a few long lines (about 9 shards of 300 positions)."""
    d = tmp_path_factory.mktemp("score_resume")
    model = BiLMPretrainer(BiLMConfig(**TINY), len(WORDS), dropout=0.0)
    randomize_weights(model, 11, scale=0.5)
    write_model_dir(model, Vocabulary(WORDS), d / "run")
    words = WORDS[3:] + ["zebra", "naïve", "日本語"]
    pick = random.Random(7)
    lines = [
        "" if k % 29 == 0 else " ".join(pick.choice(words) for _ in range(pick.randint(1, 30 if k % 40 == 0 else 10)))
        for k in range(300)
    ]
    (d / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return d


def run_score(files, output, *extra, fault=None, model=("--model",), input=None):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop(FAULT_ENV, None)
    if fault:
        env[FAULT_ENV] = fault
    if model == ("--model",):
        model = ("--model", files / "run")
    argv = [*model, "--input", input or files / "in.txt", "--output", output, *FLAGS, *extra]
    return subprocess.run(
        [sys.executable, "-m", "elmo_tf", "score", *[str(a) for a in argv]],
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=WAIT,
    )


def shards(output):
    state = state_dir_of(output)
    return sorted(name for name in os.listdir(state) if name.startswith("shard-")) if os.path.isdir(state) else []


def resumed(result):
    found = RESUMED.findall(result.stderr)
    assert found, result.stderr[-3000:]
    return tuple(int(n) for n in found[-1])


@pytest.fixture(scope="module")
def reference(files, tmp_path_factory):
    """The uninterrupted run: its bytes, its result (progress lines: stderr is a pipe) and its shard count."""
    out = tmp_path_factory.mktemp("reference") / "out.jsonl"
    result = run_score(files, out, "--log-interval", "0.001")
    assert result.returncode == 0, result.stderr[-3000:]
    assert not os.path.exists(state_dir_of(out))
    done, total = resumed(result)
    assert done == 0 and total >= 6
    data = out.read_bytes()
    assert data.count(b"\n") == 300
    return data, result, total


CHAIN = [
    ("batch:9:SIGKILL", 1),  # a shard and some done: the rest of the shard is lost
    ("shard-write:2:SIGTERM", 2),  # while a shard is written: its temporary removed, the finished ones kept
    ("shard:2:SIGKILL", 4),  # just after a shard is committed
    ("merge:3:SIGKILL", None),  # every shard done, the output's temporary part built
    ("merged:1:SIGTERM", None),  # the output in place, the journal not yet removed
]


def test_kills_then_resume_give_the_uninterrupted_bytes(files, reference, tmp_path):
    output = tmp_path / "out.jsonl"
    output.write_bytes(PREVIOUS)
    for k, (fault, at_least) in enumerate(CHAIN):
        result = run_score(files, output, *(["--resume"] if k else []), fault=fault)
        assert result.returncode == SIGNALLED[fault.rsplit(":", 1)[1]], (fault, result.stderr[-3000:])
        assert "Traceback" not in result.stderr, result.stderr[-3000:]
        if "SIGTERM" in fault:
            assert f"finished shards are kept in {state_dir_of(output)}" in result.stderr, result.stderr[-3000:]
        if not fault.startswith("merged"):
            assert output.read_bytes() == PREVIOUS, fault  # an older output survives every interruption
        assert len(shards(output)) >= (reference[2] if at_least is None else at_least), (fault, shards(output))
    result = run_score(files, output, "--resume")
    assert result.returncode == 0, result.stderr[-3000:]
    assert resumed(result) == (reference[2], reference[2])
    assert output.read_bytes() == reference[0]
    assert not os.path.exists(state_dir_of(output))
    assert sorted(p.name for p in tmp_path.rglob("*") if ".tmp-" in p.name) == []


def test_a_resume_that_differs_is_refused_naming_each_difference(files, reference, tmp_path):
    output = tmp_path / "out.jsonl"
    killed = run_score(files, output, fault="shard:2:SIGKILL")
    assert killed.returncode == -signal.SIGKILL
    before = shards(output)
    assert len(before) == 2
    run = files / "run"
    other = {name: tmp_path / name for name in ("in.txt", "softmax.hdf5", "vocab.txt")}
    other["in.txt"].write_bytes((files / "in.txt").read_bytes().replace(b"cat", b"dog", 1))
    other["softmax.hdf5"].write_bytes((run / "softmax.hdf5").read_bytes())
    with h5py.File(other["softmax.hdf5"], "r+") as f:
        f["softmax/b"][3] += 1.0
    vocab = (run / "vocab.txt").read_text(encoding="utf-8").split("\n")
    vocab[3], vocab[4] = vocab[4], vocab[3]
    other["vocab.txt"].write_text("\n".join(vocab), encoding="utf-8")
    model = ("--options", run / "options.json", "--weights", run / "weights.hdf5")
    model += ("--softmax", other["softmax.hdf5"], "--vocab", other["vocab.txt"])
    result = run_score(files, output, "--resume", "--top-k", "3", model=model, input=other["in.txt"])
    line = assert_one_error(result, 2, "--resume", str(output), "run without --resume")
    for needle in ("--input: sha256", "--softmax: sha256", "--vocab: sha256", "--top-k: 2 then, 3 now"):
        assert needle in line, (needle, line)
    assert str(other["softmax.hdf5"]) in line and str(run / "softmax.hdf5") in line  # the files named, both times
    assert "--options/--weights" not in line and "--batch-size" not in line  # what is the same is not named
    assert shards(output) == before and not output.exists()  # the refused run changed nothing
    result = run_score(files, output, "--resume")
    assert result.returncode == 0, result.stderr[-3000:]
    assert resumed(result)[0] == 2
    assert output.read_bytes() == reference[0]


def test_progress_lines_when_stderr_is_not_a_terminal(reference):
    result = reference[1]
    lines = [line for line in own_lines(result.stderr) if "score: " in line and "sentences/s" in line]
    assert len(lines) >= 3, result.stderr[-3000:]
    numbers = [int(re.search(r"score: (\d+)/300 sentences", line).group(1)) for line in lines]
    assert numbers == sorted(numbers) and 0 < numbers[0] < 300
    assert all(re.search(r"\(\d+\.\d%\), \d+\.\d sentences/s, ETA \d+:\d\d:\d\d", line) for line in lines), lines
    assert "\r" not in result.stderr  # no bar redrawn into a log file


def test_quiet_prints_nothing(files, reference, tmp_path):
    output = tmp_path / "out.jsonl"
    result = run_score(files, output, "--quiet", "--log-interval", "0.001")
    assert result.returncode == 0, result.stderr
    assert own_lines(result.stderr) == []
    assert output.read_bytes() == reference[0]
