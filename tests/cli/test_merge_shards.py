"""elmo_tf/cli/merge_shards.py: `elmo-tf merge-shards` writes one file; a set of shards that overlap or leave a gap is
refused with one line naming the file and the index (exit 1), and nothing is written; a merge interrupted half-way
leaves the previous output as it was."""

import re

import h5py
import numpy as np
import pytest
from cli_testlib import assert_one_error, run_command
from resume_testlib import PREVIOUS, SIGNALLED, run_elmo_tf

from elmo_tf.io.embeddings_shards import shard_path
from elmo_tf.io.sentences import EmbeddingWriter


def write(path, indices):
    with EmbeddingWriter(path) as writer:
        for i in indices:
            writer.add_key(i, f"line {i}".encode())
            writer.write(i, np.full([2, 1 + i % 3, 4], i, np.float32))


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
    write(tmp_path / "a.hdf5", [0, 1])
    write(tmp_path / "b.hdf5", [1, 2])
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
