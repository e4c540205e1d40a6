"""training/evaluate_lm.py with careless input: one error line naming the flag and the file (and the line or
key), exit 2 for usage errors, 1 for data errors, no traceback; --output written atomically."""

import json
import os

import h5py
import numpy as np
import pytest
from cli_testlib import REPO_ROOT, assert_ends_with_one_error, assert_one_error, run_command, run_limited
from tiny_models import TINY

from elmo_tf.config import BiLMConfig
from elmo_tf.io.vocabulary import Vocabulary
from elmo_tf.models import BiLMPretrainer
from elmo_tf.pretraining import write_model_dir

SCRIPT = REPO_ROOT / "training" / "evaluate_lm.py"
PROG = "evaluate_lm.py: error:"
WORDS = ["<S>", "</S>", "<UNK>", "the", "cat", "sat"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """An untrained tiny biLM as training/pretrain.py writes it (options, weights, softmax, vocab)."""
    d = tmp_path_factory.mktemp("evaluate_lm") / "run"
    write_model_dir(BiLMPretrainer(BiLMConfig(**TINY), len(WORDS), dropout=0.0), Vocabulary(WORDS), d)
    return d


@pytest.fixture
def model(model_dir, tmp_path):
    """A copy of the model dir, to damage."""
    d = tmp_path / "model"
    d.mkdir()
    for p in model_dir.iterdir():
        (d / p.name).write_bytes(p.read_bytes())
    return d


@pytest.fixture
def test_file(tmp_path):
    path = tmp_path / "test.txt"
    path.write_text("the cat sat\nthe cat\n", encoding="utf-8")
    return path


def evaluate(model, test, *extra):
    return run_command([SCRIPT, "--model", model, "--test", test, *extra])


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--batch-size", "0"], "--batch-size must be >= 1, got '0'"),
        (["--max-tokens", "-5"], "--max-tokens must be >= 1, got '-5'"),
        (["--max-tokens", "nan"], "--max-tokens must be an integer, got 'nan'"),
    ],
)
def test_bad_numbers(model_dir, test_file, extra, needle):
    assert_one_error(evaluate(model_dir, test_file, *extra), 2, PROG, needle)


def test_missing_paths(model_dir, test_file, tmp_path):
    assert_one_error(
        evaluate(tmp_path / "nope", test_file), 2, PROG, f"--model: not a directory: '{tmp_path / 'nope'}'"
    )
    assert_one_error(evaluate(model_dir, tmp_path / "nope.txt"), 2, "--test: no such file", "nope.txt")
    assert_one_error(evaluate(model_dir, tmp_path), 2, f"--test: is a directory: '{tmp_path}'")


def test_a_model_dir_without_its_softmax(model, test_file):
    (model / "softmax.hdf5").unlink()
    assert_one_error(evaluate(model, test_file), 2, PROG, f"--model: '{model}' has no softmax.hdf5")


def test_output_over_an_input_or_in_a_missing_directory(model, test_file, tmp_path):
    before = test_file.read_text()
    assert_one_error(evaluate(model, test_file, "--output", test_file), 2, "--output", "same file as --test")
    assert_one_error(evaluate(model, test_file, "--output", model / "vocab.txt"), 2, "same file as --model")
    missing = tmp_path / "nope" / "ppl.json"
    assert_one_error(evaluate(model, test_file, "--output", missing), 2, "--output: the directory", "does not exist")
    assert test_file.read_text() == before and (model / "vocab.txt").read_text().startswith("<S>")


@pytest.mark.parametrize(
    "data,needle",
    [
        (b"", ": the file is empty"),
        (b"\n  \n\t\n", ": no tokens (all 3 lines are blank)"),
        ("the cat\n".encode("utf-16"), ":1: starts with a UTF-16/UTF-32 byte order mark"),
        (b"the\ncat\x00\n", ":2: NUL byte at byte offset 7"),
    ],
    ids=["empty", "blank", "utf16", "nul"],
)
def test_test_files_that_are_not_usable(model_dir, tmp_path, data, needle):
    path = tmp_path / "test.txt"
    path.write_bytes(data)
    assert_one_error(evaluate(model_dir, path), 1, PROG, f"--test: {path}{needle}")


def test_options_with_a_wrong_type(model, test_file):
    options = json.loads((model / "options.json").read_text())
    options["lstm"]["n_layers"] = [2]
    (model / "options.json").write_text(json.dumps(options))
    line = assert_one_error(evaluate(model, test_file), 1, PROG)
    assert line.endswith(f"--model: {model / 'options.json'}: lstm.n_layers must be a positive int, got [2]")


@pytest.mark.parametrize("name", ["weights.hdf5", "softmax.hdf5"])
def test_hdf5_files_that_are_not_hdf5(model, test_file, name):
    (model / name).write_text("not hdf5 at all\n")
    assert_one_error(evaluate(model, test_file), 1, PROG, f"--model: {model / name}: cannot read the", "not HDF5")


def test_a_weight_of_the_wrong_shape(model, test_file):
    name = "CNN_high_0/b_carry"
    with h5py.File(model / "weights.hdf5", "r+") as f:
        del f[name]
        f.create_dataset(name, data=np.zeros(5, np.float32))
    assert_one_error(evaluate(model, test_file), 1, PROG, f"--model: {model / 'weights.hdf5'}: dataset {name!r}")


def test_a_vocabulary_in_utf16_or_with_a_duplicate(model, test_file):
    vocab = model / "vocab.txt"
    vocab.write_bytes("\n".join(WORDS).encode("utf-16"))
    assert_one_error(
        evaluate(model, test_file), 1, PROG, f"--model: cannot read vocabulary {vocab}:1: starts with a UTF-16"
    )
    vocab.write_text("\n".join(WORDS + ["cat"]) + "\n")
    assert_one_error(evaluate(model, test_file), 1, f"{vocab}:7: duplicate word 'cat' (first on line 5)")


def test_output_is_written_atomically(model_dir, test_file, tmp_path):
    out = tmp_path / "ppl.json"
    stale = tmp_path / ".ppl.json.tmp-999999999-0badf00d"
    stale.write_text("{")
    result = evaluate(model_dir, test_file, "--output", out, "--batch-size", "1")
    assert result.returncode == 0, result.stderr
    written = json.loads(out.read_text())
    assert written == json.loads(result.stdout)
    assert written["tokens"] == (3 + 1) + (2 + 1)  # words + </S> (forward; <S> backward) per line
    assert 1.0 < written["average"] < 2 * len(WORDS)  # untrained: about the vocabulary size
    assert not stale.exists()
    assert sorted(os.listdir(tmp_path)) == ["ppl.json", "test.txt"]


def test_a_full_disk_keeps_the_old_output_and_names_it(model_dir, test_file, tmp_path):
    """--output and stdout on a disk that refuses them (a file-size limit below the JSON's size: EFBIG, as a full
    disk gives ENOSPC): exit 1, one line naming the file and the error; an existing --output kept."""
    output = tmp_path / "ppl.json"
    output.write_text("older\n")
    result = run_limited([SCRIPT, "--model", model_dir, "--test", test_file, "--output", output], 64)
    assert_ends_with_one_error(result, 1, "--output", f"cannot write {str(output)!r}", "File too large")
    assert json.loads(result.stdout)["test"] == str(test_file)  # stdout (a pipe) is not limited
    assert output.read_text() == "older\n" and sorted(os.listdir(tmp_path)) == ["ppl.json", "test.txt"]
    with open(tmp_path / "stdout.json", "w") as stdout:
        result = run_limited([SCRIPT, "--model", model_dir, "--test", test_file], 64, stdout=stdout)
    assert_ends_with_one_error(result, 1, "stdout", f"cannot write {str(tmp_path / 'stdout.json')!r}", "File too large")
