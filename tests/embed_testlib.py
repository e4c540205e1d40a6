"""What the tests of `elmo_tf.embed` and `elmo-tf embed` share: a small input of odd lines, a longer random one, and
an embed output read back."""

import json
from pathlib import Path

import h5py
import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES = REPO_ROOT.parent / "shared" / "data" / "elmo_fixtures" / "allennlp"
L, P = 2, 8  # tiny config: 2 LSTM layers, projection 8

LINES = [
    "The cat sat on the mat .",
    "",
    "Hi",
    "a much longer sentence with many more tokens than any of the others",
    "naïve 日本語 tokens",
    "   \t",
    "x  y",
    "Hi",
    "one two three four five",
]


def write_lines(directory):
    """`LINES` as a UTF-8 text file in `directory`; returns its path."""
    path = directory / "sentences.txt"
    path.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return path


def read_output(path):
    """`({dataset name: array}, sentence_to_index)` of the embed output `path`."""
    with h5py.File(path, "r") as f:
        index = json.loads(f["sentence_to_index"][0])
        arrays = {key: f[key][...] for key in f if key != "sentence_to_index"}
    return arrays, index


def long_input(tmp_path, n=400, seed=0):
    rng = np.random.default_rng(seed)
    words = "the cat sat on a mat and ran far away naïve café , .".split()
    lines = [" ".join(rng.choice(words, size=rng.integers(0, 30))) for _ in range(n)]
    path = tmp_path / "long.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
