"""`python -m elmo_tf score --resume` after kill -9 and SIGTERM at chosen points, in real subprocesses.

As tests/embed/test_run_resume.py does for embed (the driver is tests/resume_testlib.py): `ELMO_TF_FAULT` makes the run
send itself a signal the k-th time it passes a point of `elmo_tf.embed.score.score_file` ("batch", "shard-write",
"shard", "merge", "merged"). After each interruption an older output is unchanged and no temporary is left but a
kill -9's own; `--resume` then writes exactly the uninterrupted run's bytes. A resume whose input, softmax,
vocabulary or --top-k differs is refused naming each (exit 2). Progress: log lines when stderr is not a terminal,
nothing with `--quiet`.
"""

import functools
import random

import h5py
import pytest
from resume_testlib import (
    ALL,
    assert_progress_lines,
    assert_quiet,
    kill_and_resume,
    refused_then_resumed,
    run_elmo_tf,
    uninterrupted,
)
from tiny_models import TINY, randomize_weights

from elmo_tf.config import BiLMConfig
from elmo_tf.io.vocabulary import Vocabulary
from elmo_tf.models import BiLMPretrainer
from elmo_tf.pretraining import write_model_dir

WORDS = ["<S>", "</S>", "<UNK>"] + "the cat sat on a mat dog ran far away . ,".split()
FLAGS = ("--batch-size", "8", "--shard-tokens", "300", "--top-k", "2")


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
    if model == ("--model",):
        model = ("--model", files / "run")
    argv = [*model, "--input", input or files / "in.txt", "--output", output, *FLAGS, *extra]
    return run_elmo_tf("score", argv, fault=fault)


@pytest.fixture(scope="module")
def reference(files, tmp_path_factory):
    """The uninterrupted run: its bytes, its result (progress lines: stderr is a pipe) and its shard count."""
    out = tmp_path_factory.mktemp("reference") / "out.jsonl"
    result, total = uninterrupted(functools.partial(run_score, files), out)
    data = out.read_bytes()
    assert data.count(b"\n") == 300
    return data, result, total


def same_as(reference):
    def assert_same(output):
        assert output.read_bytes() == reference[0]

    return assert_same


# (fault, shards on disk right after it: at least); each run but the first with --resume
CHAIN = [
    ("batch:9:SIGKILL", 1),  # a shard and some done: the rest of the shard is lost
    ("shard-write:2:SIGTERM", 2),  # while a shard is written: its temporary removed, the finished ones kept
    ("shard:2:SIGKILL", 4),  # just after a shard is committed
    ("merge:3:SIGKILL", ALL),  # every shard done, the output's temporary part built
    ("merged:1:SIGTERM", ALL),  # the output in place, the journal not yet removed
]


@pytest.mark.slow
def test_kills_then_resume_give_the_uninterrupted_bytes(files, reference, tmp_path):
    kill_and_resume(
        functools.partial(run_score, files), tmp_path / "out.jsonl", CHAIN, reference[2], same_as(reference)
    )


def test_a_resume_that_differs_is_refused_naming_each_difference(files, reference, tmp_path):
    output = tmp_path / "out.jsonl"
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
    line = refused_then_resumed(
        functools.partial(run_score, files),
        output,
        lambda: run_score(
            *(files, output, "--resume", "--top-k", "3", "--precision", "bfloat16", "--quiet"),
            model=model,
            input=other["in.txt"],
        ),
        ("--input: sha256", "--softmax: sha256", "--vocab: sha256", "--top-k: 2 then, 3 now")
        + ('--precision: "float32" then, "bfloat16" now',),
        same_as(reference),
    )
    assert str(other["softmax.hdf5"]) in line and str(run / "softmax.hdf5") in line  # the files named, both times
    assert "--options/--weights" not in line and "--batch-size" not in line  # what is the same is not named


def test_progress_lines_when_stderr_is_not_a_terminal(reference):
    assert_progress_lines(reference[1], "score", 300)


def test_quiet_prints_nothing(files, reference, tmp_path):
    assert_quiet(functools.partial(run_score, files), tmp_path / "out.jsonl", same_as(reference))
