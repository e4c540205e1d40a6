"""elmo_tf/cli/merge_shards.py: `elmo-tf merge-shards` writes one file; a set of shards that overlap or leave a gap is
refused with one line naming the file and the index (exit 1), and nothing is written; so are shards of two runs and
an incomplete set (the file, the attribute and both values), and shards without their run's fingerprint; an output
that cannot be written is one true line, nothing of it left; a merge interrupted half-way leaves the previous output
as it was. (Shards of a real beam-embed run: tests/beam/test_beam_pipeline.py.)"""

import json
import os
import re
import shutil

import h5py
import numpy as np
import pytest
from cli_testlib import assert_one_error, run_command
from resume_testlib import PREVIOUS, SIGNALLED, run_elmo_tf

from elmo_tf.io.embeddings_shards import SHARD_PATTERN, shard_path
from elmo_tf.io.sentences import EmbeddingWriter

# a run's fingerprint as beam-embed writes it (one root attribute "run.<entry>" per entry, its JSON text; see
# elmo_tf.beam.pipeline.shard_fingerprint), written here by hand: the attribute names are the format
FINGERPRINT = {
    "model": "3" * 64,
    "layers": "all",
    "dtype": "float32",
    "precision": "float32",
    "input": {"lines_sha256": "a" * 64, "lines": 5, "bytes": 30},
    "batch_size": 64,
    "max_sentence_tokens": 1000,
}


def stamp(path, shard, count, **changes):
    """Marks `path` as shard `shard` of `count` of the run `FINGERPRINT` (with `changes`)."""
    with h5py.File(path, "r+") as f:
        for entry, value in {**FINGERPRINT, **changes}.items():
            f.attrs[f"run.{entry}"] = json.dumps(value, sort_keys=True)
        f.attrs["shard.index"] = shard
        f.attrs["shard.count"] = count


def write(path, indices, place=None, layers="all", dtype="float32", **changes):
    """An embed output of lines `indices`, marked as the shard its name says (or `place`: `(shard, count)`); none:
    `place=False`."""
    with EmbeddingWriter(path, dtype=dtype) as writer:
        for i in indices:
            writer.add_key(i, f"line {i}".encode())
            shape = [2, 1 + i % 3, 4] if layers == "all" else [1 + i % 3, 4]
            writer.write(i, np.full(shape, i, np.float32))
    match = SHARD_PATTERN.match(str(path))
    if place is None and match:
        place = int(match["shard"]), int(match["count"])
    if place:
        stamp(path, *place, layers=layers, dtype=dtype, **changes)


def merge(*args):
    return run_command(["-m", "elmo_tf", "merge-shards", *args])


def test_merge_writes_one_file(tmp_path):
    prefix = str(tmp_path / "e")
    write(shard_path(prefix, 0, 2), [0, 1])
    write(shard_path(prefix, 1, 2), [2])
    result = merge("--input", prefix, "--output", tmp_path / "m.hdf5")
    assert result.returncode == 0, result.stderr
    with h5py.File(tmp_path / "m.hdf5", "r") as f:
        assert sorted(f) == ["0", "1", "2", "sentence_to_index"]
        np.testing.assert_array_equal(f["2"][...], np.full([2, 3, 4], 2, np.float32))
        assert f["sentence_to_index"][0].decode() == '{"line 0": "0", "line 1": "1", "line 2": "2"}'


def test_overlapping_shards_are_one_error_line(tmp_path):
    write(tmp_path / "a.hdf5", [0, 1], place=(0, 2))
    write(tmp_path / "b.hdf5", [1, 2], place=(1, 2))
    result = merge("--input", tmp_path / "a.hdf5", tmp_path / "b.hdf5", "--output", tmp_path / "m.hdf5")
    assert_one_error(result, 1, "line index 1 is also in", "a.hdf5", "(overlap)")
    assert not (tmp_path / "m.hdf5").exists()


def test_missing_index_and_missing_shard_are_one_error_line(tmp_path):
    prefix = str(tmp_path / "e")
    write(shard_path(prefix, 0, 3), [0])
    write(shard_path(prefix, 2, 3), [2])
    assert_one_error(merge("--input", prefix, "--output", tmp_path / "m.hdf5"), 1, "e-00001-of-00003.hdf5: missing")
    write(shard_path(prefix, 1, 3), [])
    assert_one_error(merge("--input", prefix, "--output", tmp_path / "m.hdf5"), 1, "line index 1 is in no shard")
    assert not (tmp_path / "m.hdf5").exists()


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGKILL"])
def test_a_merge_interrupted_half_way_leaves_the_previous_output(tmp_path, signal_name):
    """Stopped once the output's temporary holds 2 of 3 shards (ELMO_TF_FAULT, elmo_tf/io/journal.py): the previous
    output is as it was; SIGTERM removes the temporary, SIGKILL cannot, and the next merge removes it."""
    prefix = str(tmp_path / "e")
    for k, indices in enumerate([[0, 1], [2], [3, 4]]):
        write(shard_path(prefix, k, 3), indices)
    out = tmp_path / "m.hdf5"
    out.write_bytes(PREVIOUS)
    args = ["--input", prefix, "--output", out]
    result = run_elmo_tf("merge-shards", args, fault=f"merge:2:{signal_name}")
    assert result.returncode == SIGNALLED[signal_name], result.stderr
    assert out.read_bytes() == PREVIOUS
    temporaries = [p.name for p in tmp_path.iterdir() if p.name.startswith(".m.hdf5.tmp-")]
    assert len(temporaries) == (signal_name == "SIGKILL"), temporaries
    result = run_elmo_tf("merge-shards", args)
    assert result.returncode == 0, result.stderr
    with h5py.File(out, "r") as f:
        assert sorted(f) == ["0", "1", "2", "3", "4", "sentence_to_index"]
        np.testing.assert_array_equal(f["4"][...], np.full([2, 2, 4], 4, np.float32))
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_progress_is_logged_when_stderr_is_not_a_terminal_and_quiet_silences_it(tmp_path):
    """A line per --log-interval with the total and the rate, as embed's; nothing but errors with --quiet."""
    prefix = str(tmp_path / "e")
    for k, indices in enumerate([[0, 1], [2], [3, 4]]):
        write(shard_path(prefix, k, 3), indices)
    args = ["--input", prefix, "--output", tmp_path / "m.hdf5"]
    result = merge(*args, "--log-interval", "0.000001")
    assert result.returncode == 0, result.stderr
    lines = re.findall(r"merge-shards: (\d+)/5 sentences \(\d+\.\d%\), [\d.]+ sentences/s, ETA", result.stderr)
    assert lines and [int(n) for n in lines] == sorted(int(n) for n in lines) and int(lines[-1]) == 5, result.stderr
    quiet = merge(*args, "--quiet")
    assert quiet.returncode == 0 and quiet.stderr.strip() == "", quiet.stderr
    bad = merge(*args, "--log-interval", "0")
    assert_one_error(bad, 2, "--log-interval")


@pytest.mark.parametrize(
    "changes,shown",
    [
        ({"layers": "top"}, ['"top"', '"all"']),
        ({"model": "4" * 64}, ["4" * 64, "3" * 64]),
        ({"dtype": "float16"}, ['"float16"', '"float32"']),
        ({"input": {"lines_sha256": "b" * 64, "lines": 5, "bytes": 31}}, ["b" * 64, "a" * 64]),
        ({"max_sentence_tokens": 50}, ["50", "1000"]),
    ],
    ids=["layers", "model", "dtype", "input", "setting"],
)
def test_shards_of_two_runs_are_refused_naming_the_attribute_and_both_values(tmp_path, changes, shown):
    """Shard 1 of another run (`--layers top`: arrays of another rank; another model, dtype, input or setting): one
    line naming the file, the attribute and both values, exit 1, nothing written (the merge wrote a file of two
    shapes, exit 0)."""
    prefix = str(tmp_path / "e")
    write(shard_path(prefix, 0, 2), [0, 1])
    entry = next(iter(changes))
    write(shard_path(prefix, 1, 2), [2, 3], **changes)
    result = merge("--input", prefix, "--output", tmp_path / "m.hdf5")
    assert_one_error(result, 1, "e-00001-of-00002.hdf5: attribute", f"'run.{entry}'", *shown, "different runs")
    assert not (tmp_path / "m.hdf5").exists()


def test_an_explicit_list_missing_a_shard_is_refused(tmp_path):
    """Only `...-00000-of-00002.hdf5` given (the merge wrote half the lines, exit 0): the missing shard's name, the
    attribute and the values."""
    prefix = str(tmp_path / "e")
    write(shard_path(prefix, 0, 2), [0, 1])
    write(shard_path(prefix, 1, 2), [2, 3])
    result = merge("--input", shard_path(prefix, 0, 2), "--output", tmp_path / "m.hdf5")
    assert_one_error(result, 1, "e-00001-of-00002.hdf5: shard 1 of 2 is missing", "shard.index 0 of shard.count 2")
    assert not (tmp_path / "m.hdf5").exists()


def test_the_same_shard_twice_and_counts_that_disagree_are_refused(tmp_path):
    """Shard 1 (empty: more shards than lines) given twice instead of shard 2, and shards of a 2-set and a 3-set
    whose lines follow one another: the line indices alone let both through (exit 0)."""
    prefix = str(tmp_path / "e")
    write(shard_path(prefix, 0, 3), [0, 1])
    write(shard_path(prefix, 1, 3), [])
    shutil.copy(shard_path(prefix, 1, 3), tmp_path / "copy.hdf5")
    args = [shard_path(prefix, 0, 3), shard_path(prefix, 1, 3), tmp_path / "copy.hdf5"]
    result = merge("--input", *args, "--output", tmp_path / "m.hdf5")
    assert_one_error(result, 1, "copy.hdf5: attribute 'shard.index' is 1, as in", "e-00001-of-00003.hdf5", "twice")
    write(tmp_path / "f-00001-of-00002.hdf5", [2, 3])
    result = merge("--input", shard_path(prefix, 0, 3), tmp_path / "f-00001-of-00002.hdf5", "--output", tmp_path / "m")
    assert_one_error(result, 1, "f-00001-of-00002.hdf5: attribute 'shard.count' is 2", "e-00000-of-00003.hdf5 has 3")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "copy.hdf5",
        "e-00000-of-00003.hdf5",
        "e-00001-of-00003.hdf5",
        "f-00001-of-00002.hdf5",
    ]


def test_shards_written_before_they_carried_a_fingerprint_are_refused(tmp_path):
    """Shards of an earlier beam-embed (no run.* nor shard.* attributes): refused, saying to run beam-embed again;
    one such shard among marked ones: refused as another run's."""
    prefix = str(tmp_path / "e")
    write(shard_path(prefix, 0, 2), [0, 1], place=False)
    write(shard_path(prefix, 1, 2), [2], place=False)
    result = merge("--input", prefix, "--output", tmp_path / "m.hdf5")
    assert_one_error(result, 1, "e-00000-of-00002.hdf5: no run fingerprint", "run beam-embed again")
    stamp(shard_path(prefix, 0, 2), 0, 2)
    result = merge("--input", prefix, "--output", tmp_path / "m.hdf5")
    assert_one_error(result, 1, "e-00001-of-00002.hdf5: no run fingerprint", "other shards have one")
    assert not (tmp_path / "m.hdf5").exists()


@pytest.fixture
def two_shards(tmp_path):
    prefix = str(tmp_path / "e")
    write(shard_path(prefix, 0, 2), [0, 1])
    write(shard_path(prefix, 1, 2), [2])
    (tmp_path / "in.txt").write_text("x\n")
    return prefix


@pytest.mark.parametrize(
    "output,status,needles",
    [
        ("in.txt/m.hdf5", 2, ["in.txt' is not a directory"]),
        ("in.txt/sub/m.hdf5", 2, ["in.txt' is not a directory"]),
        ("missing/m.hdf5", 2, ["missing' does not exist"]),
        (".", 2, ["is a directory"]),
    ],
    ids=["under-a-file", "under-a-file-deeper", "missing-directory", "a-directory"],
)
def test_an_output_that_cannot_be_written_is_one_true_line(two_shards, tmp_path, output, status, needles):
    """An output under a regular file used as a directory (ENOTDIR: was said to be a missing directory), in a missing
    directory, or a directory itself: one line, exit 2, nothing written."""
    before = sorted(p.name for p in tmp_path.iterdir())
    result = merge("--input", two_shards, "--output", tmp_path / output)
    assert_one_error(result, status, "--output", *needles)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


READ_ONLY = """
import errno, os, sys
read_only = os.path.abspath(sys.argv[1])
real_open = os.open

def refusing_open(path, flags, *args, **kwargs):  # what a read-only directory does to a user other than root
    if flags & os.O_CREAT and os.path.dirname(os.path.abspath(os.fsdecode(path))) == read_only:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
    return real_open(path, flags, *args, **kwargs)

os.open = refusing_open
from elmo_tf.cli import run
from elmo_tf.cli.merge_shards import main
sys.exit(run(main, sys.argv[2:], prog="elmo-tf merge-shards"))
"""

VANISHED = """
import sys
import elmo_tf.cli.merge_shards as merge_shards
from elmo_tf.cli import run
merge_shards.check_output_file = lambda *args, **kwargs: None  # the directory is removed after the checks
sys.exit(run(merge_shards.main, sys.argv[1:], prog="elmo-tf merge-shards"))
"""


def test_a_read_only_output_directory_is_one_line_and_leaves_nothing(two_shards, tmp_path):
    """chmod 555 (which root ignores: its file creation is refused as the kernel refuses another user's): exit 2
    from the check where it sees it, 1 from the write where only that refuses; one line, no traceback, nothing
    left in the directory."""
    read_only = tmp_path / "ro"
    read_only.mkdir()
    read_only.chmod(0o555)
    try:
        status = 1 if os.access(read_only, os.W_OK) else 2  # root: the check passes, the write is refused
        args = ["--input", two_shards, "--output", read_only / "m.hdf5"]
        result = run_command(["-c", READ_ONLY, read_only, *args])
        assert_one_error(result, status, "--output", "ro' is not writable")
        assert list(read_only.iterdir()) == []
    finally:
        read_only.chmod(0o755)


def test_an_output_directory_removed_after_the_checks_is_one_line(two_shards, tmp_path):
    """The output's directory gone when the merge writes (the FileNotFoundError traceback): one line, exit 1."""
    result = run_command(["-c", VANISHED, "--input", two_shards, "--output", tmp_path / "gone" / "m.hdf5"])
    assert_one_error(result, 1, "--output: cannot write", "gone' does not exist")
    assert not (tmp_path / "gone").exists()
