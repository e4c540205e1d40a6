"""`python -m elmo_tf embed` (elmo_tf/__main__.py) with careless input: one error line naming the flag and the
file (and the line or key), exit 2 for usage errors, 1 for data errors, no traceback, no output written."""

import json
import os

import h5py
import numpy as np
import pytest
from cli_testlib import assert_one_error, run_command
from tiny_models import TINY

from elmo_tf.config import BiLMConfig
from elmo_tf.models import ELMo, save_elmo

PROG = "python -m elmo_tf embed: error:"
SENTENCES = "The cat sat .\n\nHi there\n"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A saved tiny biLM (model/options.json, model/weights.hdf5) and an input file, shared by the module."""
    d = tmp_path_factory.mktemp("embed_cli")
    save_elmo(ELMo(BiLMConfig(**TINY)), d / "model")
    (d / "in.txt").write_text(SENTENCES, encoding="utf-8")
    return d


def embed(files, *extra, options=None, weights=None, input=None, output=None):
    args = [
        "--options",
        options or files / "model" / "options.json",
        "--weights",
        weights or files / "model" / "weights.hdf5",
        "--input",
        input or files / "in.txt",
        "--output",
        output or files / "out.hdf5",
        *extra,
    ]
    return run_command(["-m", "elmo_tf", "embed", *args])


# ---------------------------------------------------------------- usage errors: exit 2, nothing loaded


@pytest.mark.parametrize(
    "flag,value,needle",
    [
        ("--batch-size", "0", "--batch-size must be >= 1, got '0'"),
        ("--batch-size", "-3", "--batch-size must be >= 1, got '-3'"),
        ("--batch-size", "nan", "--batch-size must be an integer, got 'nan'"),
        ("--max-batch-tokens", "0", "--max-batch-tokens must be >= 1, got '0'"),
        ("--max-sentence-tokens", "-1", "--max-sentence-tokens must be >= 1, got '-1'"),
        ("--threads", "-1", "--threads must be >= 0, got '-1'"),
        ("--threads", "1.5", "--threads must be an integer, got '1.5'"),
        ("--layers", "middle", "--layers: invalid choice: 'middle'"),
    ],
)
def test_bad_numbers_and_choices(files, flag, value, needle):
    assert_one_error(embed(files, flag, value), 2, PROG, needle)
    assert not (files / "out.hdf5").exists()


@pytest.mark.parametrize("flag", ["--options", "--weights", "--input"])
def test_missing_inputs_and_directories(files, tmp_path, flag):
    missing = {flag.lstrip("-"): tmp_path / "nope"}
    assert_one_error(embed(files, **missing), 2, f"{flag}: no such file: '{tmp_path / 'nope'}'")
    directory = {flag.lstrip("-"): tmp_path}
    assert_one_error(embed(files, **directory), 2, f"{flag}: is a directory: '{tmp_path}'")


def test_output_same_as_input_or_a_link_to_it(files, tmp_path):
    source = tmp_path / "sentences.txt"
    source.write_text(SENTENCES)
    assert_one_error(embed(files, input=source, output=source), 2, "--output", "same file as --input", source)
    link = tmp_path / "link.hdf5"
    link.symlink_to(source)
    assert_one_error(embed(files, input=source, output=link), 2, "--output", "same file as --input", link)
    relative = os.path.relpath(source, files.parent)  # another spelling of the same path
    result = run_command(
        ["-m", "elmo_tf", "embed", "--options", files / "model" / "options.json", "--weights",
         files / "model" / "weights.hdf5", "--input", source, "--output", relative],
        cwd=files.parent,
    )  # fmt: skip
    assert_one_error(result, 2, "same file as --input")
    assert source.read_text() == SENTENCES  # never touched


def test_output_over_the_weights_or_options(files):
    weights = files / "model" / "weights.hdf5"
    before = weights.read_bytes()
    assert_one_error(embed(files, output=weights), 2, "--output", "same file as --weights")
    assert_one_error(embed(files, output=files / "model" / "options.json"), 2, "same file as --options")
    assert weights.read_bytes() == before


def test_output_directory_missing_or_output_is_a_directory(files, tmp_path):
    out = tmp_path / "no" / "such" / "dir" / "out.hdf5"
    assert_one_error(embed(files, output=out), 2, "--output: the directory", "does not exist")
    assert_one_error(embed(files, output=tmp_path), 2, f"--output: is a directory: '{tmp_path}'")


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write into any directory")
def test_output_directory_not_writable(files, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    assert_one_error(embed(files, output=locked / "out.hdf5"), 2, "--output", "is not writable")


def test_usage_errors_come_before_data_errors(files, tmp_path):
    bad = tmp_path / "weights.hdf5"
    bad.write_text("not hdf5")
    assert_one_error(embed(files, weights=bad, output=tmp_path / "x" / "out.hdf5"), 2, "--output")


def test_no_subcommand():
    assert_one_error(run_command(["-m", "elmo_tf"]), 2, "python -m elmo_tf: error:", "command")


# ---------------------------------------------------------------- data errors: exit 1, one line


def test_options_with_a_wrong_type(files, tmp_path):
    options = json.loads((files / "model" / "options.json").read_text())
    options["lstm"]["dim"] = "4096"
    path = tmp_path / "options.json"
    path.write_text(json.dumps(options))
    line = assert_one_error(embed(files, options=path, output=tmp_path / "out.hdf5"), 1, PROG)
    assert line.endswith(f"--options: {path}: lstm.dim must be a positive int, got '4096'")
    assert not (tmp_path / "out.hdf5").exists()


def test_options_that_are_not_json(files, tmp_path):
    path = tmp_path / "options.json"
    path.write_text('{\n  "lstm": {"dim": 16,}\n}\n')
    assert_one_error(embed(files, options=path), 1, f"--options: {path}:2: not valid JSON")


@pytest.mark.parametrize("damage", ["not-hdf5", "truncated", "strings", "shape"])
def test_bad_weight_files(files, tmp_path, damage):
    path = tmp_path / "weights.hdf5"
    data = (files / "model" / "weights.hdf5").read_bytes()
    path.write_bytes(
        b"GIF89a" * 100 if damage == "not-hdf5" else data[: len(data) // 3] if damage == "truncated" else data
    )
    name = "RNN_1/RNN/MultiRNNCell/Cell0/LSTMCell/B"
    if damage in ("strings", "shape"):
        with h5py.File(path, "r+") as f:
            del f[name]
            if damage == "strings":
                f.create_dataset(name, data=np.array(["x"] * 64, dtype=object), dtype=h5py.string_dtype())
            else:
                f.create_dataset(name, data=np.zeros(63, np.float32))
    needles = {"not-hdf5": ["not HDF5"], "truncated": ["truncated"], "strings": [name, "strings"]}
    needles["shape"] = [name, "(63,)", "(64,)"]
    line = assert_one_error(embed(files, weights=path, output=tmp_path / "out.hdf5"), 1, f"--weights: {path}: ")
    for needle in needles[damage]:
        assert needle in line
    assert not (tmp_path / "out.hdf5").exists()


@pytest.mark.parametrize(
    "data,needle",
    [
        (SENTENCES.encode("utf-16"), ":1: starts with a UTF-16/UTF-32 byte order mark"),
        (b"one\ntwo\nthr\x00ee\n", ":3: NUL byte at byte offset 11"),
        (b"", ": the file is empty"),
    ],
    ids=["utf16", "nul", "empty"],
)
def test_input_files_that_are_not_text(files, tmp_path, data, needle):
    path = tmp_path / "in.txt"
    path.write_bytes(data)
    assert_one_error(embed(files, input=path, output=tmp_path / "out.hdf5"), 1, PROG, f"--input: {path}{needle}")
    assert not (tmp_path / "out.hdf5").exists()


def test_latin1_input_is_embedded_byte_for_byte(files, tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("café au lait\nnaïve\n".encode("latin-1"))
    out = tmp_path / "out.hdf5"
    result = embed(files, "--layers", "top", input=path, output=out)
    assert result.returncode == 0, result.stderr
    with h5py.File(out, "r") as f:
        assert f["0"].shape == (3, 16) and f["1"].shape == (1, 16)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latin1.txt", "out.hdf5"]


# ---------------------------------------------------------------- more careless users


def test_options_and_weights_swapped(files, tmp_path):
    model = files / "model"
    result = embed(files, options=model / "weights.hdf5", weights=model / "options.json", output=tmp_path / "o.hdf5")
    assert_one_error(
        result, 1, PROG, f"--options: {model / 'weights.hdf5'}:1: invalid UTF-8 (byte 0x89 at byte offset 0)"
    )


def test_output_named_like_a_directory(files, tmp_path):
    out = f"{tmp_path / 'results'}{os.sep}"
    assert_one_error(embed(files, output=out), 2, PROG, "--output", "ends with a separator")
    assert list(tmp_path.iterdir()) == []


def test_a_journal_path_no_run_made_is_a_usage_error_naming_output(files, tmp_path):
    """`.<output>.partial` that is a symbolic link, or a directory holding files no run wrote: left as it is, and the
    run refused with one line naming --output (exit 2: pick another output), not a generic exit 1."""
    output = tmp_path / "out.hdf5"
    state = tmp_path / ".out.hdf5.partial"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("mine\n")
    state.symlink_to(elsewhere)
    result = embed(files, output=output)
    assert_one_error(result, 2, f"{PROG} --output: ", "is a symbolic link")
    assert (elsewhere / "keep.txt").read_text() == "mine\n" and not output.exists()
    state.unlink()
    state.mkdir()
    (state / "notes.txt").write_text("mine\n")
    result = embed(files, output=output)
    assert_one_error(result, 2, f"{PROG} --output: ", "holds notes.txt, which no elmo_tf run wrote")
    assert (state / "notes.txt").read_text() == "mine\n" and not output.exists()
