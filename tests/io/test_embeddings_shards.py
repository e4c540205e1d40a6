"""elmo_tf/io/embeddings_shards.py: shard sets read as one mapping, merged into one embed output, refused when they
overlap or leave a gap, when they are not one run's complete set (their fingerprints and places), or when a shard
points outside itself (no TensorFlow, no Beam: shards written here with embed's EmbeddingWriter and marked with
`shard_attrs` as beam-embed marks them)."""

import json

import h5py
import numpy as np
import pytest

from elmo_tf.io.embeddings_shards import (
    SHARD_PATTERN,
    ShardError,
    find_shards,
    merge_shards,
    merged_index_text,
    open_shards,
    shard_attrs,
    shard_path,
)
from elmo_tf.io.sentences import EmbeddingWriter

LINES = [b"a b", b"", "na\xefve \u65e5\u672c".encode(), b"a b", b"c", b"  a b\t", b"d e f"]


def array_of(index):
    return np.random.default_rng(index).standard_normal([3, index % 4, 2]).astype(np.float32)


FINGERPRINT = {"model": "0" * 64, "layers": "all", "dtype": "float32", "input": {"lines_sha256": "1" * 64}}


def mark(path, shard, count, **changes):
    """Marks `path` as shard `shard` of `count` of the run `FINGERPRINT` (with `changes`), as beam-embed does."""
    with h5py.File(path, "r+") as f:
        f.attrs.update(shard_attrs({**FINGERPRINT, **changes}, shard, count))


def write(path, indices, place=None, dtype="float32"):
    """An embed output of lines `indices`, marked as the shard its name says (or `place`: `(shard, count)`)."""
    with EmbeddingWriter(path, dtype=dtype) as writer:
        for i in indices:
            writer.add_key(i, LINES[i])
            writer.write(i, array_of(i))
    match = SHARD_PATTERN.match(str(path))
    place = place or (match and (int(match["shard"]), int(match["count"])))
    if place:
        mark(path, *place, dtype=dtype)


@pytest.fixture
def shards(tmp_path):
    prefix = str(tmp_path / "emb")
    ranges = [range(0, 3), range(3, 3), range(3, 7)]  # an empty shard in the middle
    for k, indices in enumerate(ranges):
        write(shard_path(prefix, k, 3), indices)
    write(tmp_path / "whole.hdf5", range(len(LINES)))
    return prefix


def test_shards_read_as_one_mapping_lazily(shards, tmp_path):
    with open_shards(shards) as view:
        assert len(view) == len(LINES) and list(view) == [str(i) for i in range(len(LINES))]
        for i in range(len(LINES)):
            np.testing.assert_array_equal(view[str(i)], array_of(i))
        assert "7" not in view and "01" not in view
        with pytest.raises(KeyError):
            view["7"]
        with h5py.File(tmp_path / "whole.hdf5", "r") as whole:
            # keys in first-line order, a repeated sentence mapped to its last line (3 -> 5 share "a b")
            assert json.dumps(view.sentence_to_index) == whole["sentence_to_index"][0].decode()
        assert view.sentence_to_index["a b"] == "5"


def test_merge_equals_the_single_file(shards, tmp_path):
    out = tmp_path / "merged.hdf5"
    assert merge_shards(shards, out) == len(LINES)
    with h5py.File(out, "r") as merged, h5py.File(tmp_path / "whole.hdf5", "r") as whole:
        assert set(merged) == set(whole)
        for name in whole:
            assert merged[name].dtype == whole[name].dtype and merged[name].shape == whole[name].shape
            if name != "sentence_to_index":
                np.testing.assert_array_equal(merged[name][...], whole[name][...])
        assert merged["sentence_to_index"][0] == whole["sentence_to_index"][0]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left


def test_overlap_gap_and_missing_shards_are_refused(tmp_path):
    prefix = str(tmp_path / "x")
    write(shard_path(prefix, 0, 2), [0, 1, 2])
    write(shard_path(prefix, 1, 2), [2, 3])
    with pytest.raises(ShardError, match=r"line index 2 is also in .*x-00000-of-00002.hdf5 \(overlap\)"):
        open_shards(prefix)
    write(shard_path(prefix, 1, 2), [4, 5])
    with pytest.raises(ShardError, match=r"line index 3 is in no shard of 2"):
        merge_shards(prefix, tmp_path / "out.hdf5")
    assert not (tmp_path / "out.hdf5").exists()
    (tmp_path / "x-00001-of-00002.hdf5").unlink()
    with pytest.raises(ShardError, match=r"x-00001-of-00002.hdf5: missing \(1 of 2 shards missing\)"):
        find_shards(prefix)
    write(shard_path(prefix, 0, 1), [0])
    with pytest.raises(ShardError, match=r"shards of different runs \(-of-00001, -of-00002\)"):
        find_shards(prefix)
    with pytest.raises(ShardError, match="no shard files"):
        find_shards(str(tmp_path / "nothing"))


def test_shards_with_and_without_sentence_index_are_refused(tmp_path):
    write(tmp_path / "a.hdf5", [0])
    with EmbeddingWriter(tmp_path / "b.hdf5", index=False) as writer:
        writer.write(1, array_of(1))
    with pytest.raises(ShardError, match="b.hdf5: has no sentence_to_index"):
        open_shards([tmp_path / "a.hdf5", tmp_path / "b.hdf5"])


def test_merged_index_text_is_the_whole_files_text_for_consecutive_shards(tmp_path):
    """3,000 lines with many repeats (whitespace ends, invalid UTF-8, escapes) cut into consecutive shards at
    random places, some empty: the merged text is byte for byte the one the whole file gets; shards that interleave
    give the same mapping."""
    rng = np.random.default_rng(7)
    pool = [b"a b", b" a b\t", b"\xff\xfe x", "na\xefve \u65e5".encode(), b'q "u" \\ e', b"c"] + [
        f"w{k}".encode() for k in range(400)
    ]
    lines = [pool[k] for k in rng.integers(0, len(pool), 3000)]

    def keys_only(path, indices):
        with EmbeddingWriter(path) as writer:
            for i in indices:
                writer.add_key(i, lines[i])
                writer.write(i, np.zeros([1, 1, 1], np.float32))

    keys_only(tmp_path / "whole.hdf5", range(len(lines)))
    with h5py.File(tmp_path / "whole.hdf5", "r") as f:
        whole = f["sentence_to_index"][0]
    cuts = sorted(rng.integers(0, len(lines), 7).tolist() + [0, 0, len(lines)])
    paths = []
    for k, (start, stop) in enumerate(zip([0, *cuts], [*cuts, len(lines)])):
        paths.append(tmp_path / f"s{k}.hdf5")
        keys_only(paths[-1], range(start, stop))
    assert merged_index_text(paths) == whole
    with open_shards(paths) as view:
        assert view.index_text() == whole
    interleaved = [tmp_path / "even.hdf5", tmp_path / "odd.hdf5"]
    keys_only(interleaved[0], range(0, len(lines), 2))
    keys_only(interleaved[1], range(1, len(lines), 2))
    assert json.loads(merged_index_text(interleaved)) == json.loads(whole)
    assert merged_index_text([]) == b"{}"


def test_gaps_are_counted_below_the_largest_index(tmp_path):
    write(tmp_path / "a.hdf5", [0])
    with EmbeddingWriter(tmp_path / "b.hdf5") as writer:
        writer.add_key(6, b"x")
        writer.write(6, array_of(6))
    with pytest.raises(ShardError, match=r"line index 1 is in no shard of 2 .*: 5 missing below 6"):
        open_shards([tmp_path / "a.hdf5", tmp_path / "b.hdf5"])


def test_merge_copies_float16_as_stored_and_refuses_other_arrays(tmp_path):
    prefix = str(tmp_path / "h")
    for k, indices in enumerate([range(0, 2), range(2, 4)]):
        write(shard_path(prefix, k, 2), indices, dtype="float16")
    assert merge_shards(prefix, tmp_path / "m.hdf5") == 4
    with h5py.File(tmp_path / "m.hdf5", "r") as f:
        assert {f[str(i)].dtype for i in range(4)} == {np.dtype(np.float16)}
        np.testing.assert_array_equal(f["3"][...], array_of(3).astype(np.float16))
        assert json.loads(f["sentence_to_index"][0]) == {"a b": "3", "": "1", LINES[2].decode(): "2"}
    with h5py.File(tmp_path / "ints.hdf5", "w") as f:
        f["0"] = np.zeros([1, 1, 1], np.int32)
    mark(tmp_path / "ints.hdf5", 0, 1)
    with pytest.raises(ShardError, match=r"ints.hdf5: arrays of int32, not float32 or float16"):
        merge_shards([tmp_path / "ints.hdf5"], tmp_path / "m2.hdf5")
    assert not (tmp_path / "m2.hdf5").exists()


def test_an_object_that_is_not_a_dataset_is_refused_when_read_or_merged(tmp_path):
    """Opening reads names only (no object: memory stays flat over many datasets); a group named like a line is
    refused, naming the file and the name, when it is read or merged, and nothing is written."""
    write(tmp_path / "a.hdf5", [0, 1], place=(0, 2))
    with h5py.File(tmp_path / "b.hdf5", "w") as f:
        f.create_group("2")
        f["sentence_to_index"] = np.array(['{"z": "2"}'], dtype=object).astype(h5py.string_dtype())
    mark(tmp_path / "b.hdf5", 1, 2)
    paths = [tmp_path / "a.hdf5", tmp_path / "b.hdf5"]
    with open_shards(paths) as view:
        np.testing.assert_array_equal(view[1], array_of(1))
        with pytest.raises(ShardError, match=r"b.hdf5: '2' is not an embed output dataset"):
            view["2"]
    with pytest.raises(ShardError, match=r"b.hdf5: '2' is not an embed output dataset"):
        merge_shards(paths, tmp_path / "m.hdf5")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.hdf5", "b.hdf5"]


def test_thousands_of_shards_stay_within_the_open_files_limit(tmp_path, monkeypatch):
    """At most OPEN_FILES shards are open at once, whatever the order of the reads; a process limited to 40 open files
    merges 60 shards (each shard open at once, as before, exceeds it)."""
    import subprocess
    import sys

    import elmo_tf.io.embeddings_shards as shards_module

    prefix = str(tmp_path / "many")
    for k in range(60):
        write(shard_path(prefix, k, 60), [k] if k < len(LINES) else [])
    monkeypatch.setattr(shards_module, "OPEN_FILES", 2)
    few = [tmp_path / f"few{k}.hdf5" for k in range(5)]
    for k, path in enumerate(few):
        write(path, [k])
    with open_shards(few) as view:
        for i in np.random.default_rng(0).permutation(5).tolist() * 2:
            np.testing.assert_array_equal(view[str(i)], array_of(i))
            assert len(view._open_files) <= 2
    code = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (40, resource.getrlimit("
        "resource.RLIMIT_NOFILE)[1])); from elmo_tf.io.embeddings_shards import merge_shards; "
        "print(merge_shards(sys.argv[1], sys.argv[2]))"
    )
    out = tmp_path / "merged.hdf5"
    result = subprocess.run(
        [sys.executable, "-c", code, prefix, str(out)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0 and result.stdout.strip() == str(len(LINES)), result.stderr[-2000:]
    with h5py.File(out, "r") as f:
        np.testing.assert_array_equal(f["6"][...], array_of(6))


def test_open_shards_checks_marked_sets_and_merge_requires_marks(tmp_path):
    """open_shards reads a set where no shard is marked (as `write_embedding_file` alone writes them) unchecked;
    merge_shards refuses it. A marked set is checked by both: the first mismatch in file order, then in entry order
    (model, layers, dtype, precision, input, token_embeddings, the rest by name)."""
    a, b = tmp_path / "a.hdf5", tmp_path / "b.hdf5"
    write(a, [0, 1], place=False)
    write(b, [2], place=False)
    with open_shards([a, b]) as view:
        assert len(view) == 3
    with pytest.raises(ShardError, match=r"a.hdf5: no run fingerprint .*run beam-embed again$"):
        merge_shards([a, b], tmp_path / "m.hdf5")
    mark(a, 0, 2)
    with pytest.raises(ShardError, match=r"b.hdf5: no run fingerprint .*other shards have one"):
        open_shards([a, b])
    mark(b, 1, 2, layers="top", dtype="float16", zzz=1)
    with pytest.raises(ShardError, match=r"""b.hdf5: attribute 'run.layers' is "top", .*a.hdf5 has "all": """):
        open_shards([a, b])
    mark(b, 1, 2, zzz=1)
    with pytest.raises(ShardError, match=r"b.hdf5: attribute 'run.zzz' is 1, .*a.hdf5 has absent: "):
        open_shards([a, b])
    with h5py.File(b, "r+") as f:
        del f.attrs["run.zzz"]
        f.attrs["shard.index"] = 2
    with pytest.raises(ShardError, match=r"b.hdf5: attribute 'shard.index' is 2, not in 0..1"):
        open_shards([a, b])
    with h5py.File(b, "r+") as f:
        f.attrs["shard.index"] = "1"
    with pytest.raises(ShardError, match=r"b.hdf5: attribute 'shard.index' is not an integer"):
        open_shards([a, b])
    mark(b, 1, 2)
    assert merge_shards([b, a], tmp_path / "m.hdf5") == 3  # any order: the lines place them
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left


def test_a_shard_that_points_outside_itself_is_refused_before_anything_is_written(tmp_path):
    """An external link named like a line (`elmo_tf.io.hdf5_safety.check_self_contained`): one line naming it, when
    the set is opened; nothing written."""
    from elmo_tf.errors import ElmoTFError

    prefix = str(tmp_path / "e")
    write(shard_path(prefix, 0, 2), [0, 1])
    write(shard_path(prefix, 1, 2), [2])
    with h5py.File(tmp_path / "other.hdf5", "w") as f:
        f["secret"] = np.full([3, 1, 2], 7, np.float32)
    with h5py.File(shard_path(prefix, 1, 2), "r+") as f:
        f["3"] = h5py.ExternalLink(str(tmp_path / "other.hdf5"), "secret")
    with pytest.raises(ElmoTFError, match=r"e-00001-of-00002.hdf5: '3' is an external link"):
        merge_shards(prefix, tmp_path / "m.hdf5")
    assert not (tmp_path / "m.hdf5").exists()
