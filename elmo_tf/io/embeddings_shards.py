"""Sets of embed output shards (`PREFIX-SSSSS-of-NNNNN.hdf5`, written by `elmo_tf.beam`) read as one mapping, and
merged into one file equal to `embed`'s.

Each shard is a valid `embed` output for a contiguous range of input lines: datasets named by the line index in the
whole input ("0", "1", ...), and `sentence_to_index` for its own lines. Shard k holds the lines `i` with
`i * NNNNN // total == k`, so the shards in order hold the lines in order (a shard may be empty when there are more
shards than lines).

Example:
    with open_shards("out/emb") as shards:          # out/emb-00000-of-00004.hdf5 ... (or a list of paths)
        vectors = shards["12"]                       # read from its shard when asked, nothing loaded before
        index = shards.sentence_to_index            # {sentence key: "line index"}, as embed writes it
    merge_shards("out/emb", "all.hdf5")              # one file, as `embed` writes it
"""

import collections.abc
import glob
import json
import os
import re

import h5py
import numpy as np

from elmo_tf.errors import ElmoTFError
from elmo_tf.io.atomic import atomic_hdf5
from elmo_tf.io.sentences import INDEX_DATASET

SHARD_PATTERN = re.compile(r"^(?P<prefix>.*)-(?P<shard>\d{5})-of-(?P<count>\d{5})\.hdf5$")


class ShardError(ElmoTFError):
    """A set of shards that is not one embed output: missing or foreign shards, overlapping or missing line
    indices. The message names the files and the index."""


def shard_path(prefix, shard, num_shards):
    """`PREFIX-SSSSS-of-NNNNN.hdf5` (Beam's default shard name template, with the .hdf5 suffix)."""
    return f"{prefix}-{shard:05d}-of-{num_shards:05d}.hdf5"


def find_shards(prefix):
    """The shard files of `prefix` (`PREFIX-SSSSS-of-NNNNN.hdf5`), in shard order. Raises `ShardError` when there is
    none, when files of two shard counts are found (two runs), or when a shard is missing."""
    found = {}
    for path in glob.glob(glob.escape(prefix) + "-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9].hdf5"):
        match = SHARD_PATTERN.match(path)
        found.setdefault(int(match["count"]), {})[int(match["shard"])] = path
    if not found:
        raise ShardError(f"{prefix}: no shard files {prefix}-SSSSS-of-NNNNN.hdf5")
    if len(found) > 1:
        counts = ", ".join(f"-of-{n:05d}" for n in sorted(found))
        raise ShardError(f"{prefix}: shards of different runs ({counts}); remove the stale ones or give the files")
    ((count, shards),) = found.items()
    missing = [k for k in range(count) if k not in shards]
    if missing:
        raise ShardError(f"{shard_path(prefix, missing[0], count)}: missing ({len(missing)} of {count} shards missing)")
    return [shards[k] for k in range(count)]


class EmbeddingShards(collections.abc.Mapping):
    """Shard files read as one mapping `{line index (str): float array}`, like an `h5py.File` of `embed`'s output
    without `sentence_to_index` (the `sentence_to_index` attribute holds it).

    Only the dataset names are read when opened; an array is read from its shard when asked for. The files stay
    open until `close()` (or the end of a `with` block).

    Args:
        paths: the shard files (any order: they are ordered by their first line index).
    Raises:
        ShardError: a line index in two shards, an index missing between 0 and the largest, shards with and without
            `sentence_to_index`, a file that is not an embed output.
    """

    def __init__(self, paths):
        self.paths = [os.fspath(p) for p in paths]
        if not self.paths:
            raise ShardError("no shard files given")
        self._files = []
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    def _open(self):
        where = {}  # line index -> file number
        for number, path in enumerate(self.paths):
            try:
                f = h5py.File(path, "r")
            except OSError as e:
                raise ShardError(f"{path}: not an hdf5 file ({e})") from None
            self._files.append(f)
            for name in f:
                if name == INDEX_DATASET:
                    continue
                if not name.isdigit() or not isinstance(f[name], h5py.Dataset):
                    raise ShardError(f"{path}: {name!r} is not an embed output dataset (a line index)")
                index = int(name)
                if index in where:
                    raise ShardError(f"{path}: line index {index} is also in {self.paths[where[index]]} (overlap)")
                where[index] = number
        missing = sorted(set(range(len(where))) - set(where))
        if missing:
            raise ShardError(
                f"line index {missing[0]} is in no shard of {len(self.paths)} ({self.paths[0]} ...): "
                f"{len(missing)} missing below {max(where)}"
            )
        with_index = [INDEX_DATASET in f for f in self._files]
        if any(with_index) and not all(with_index):
            path = self.paths[with_index.index(False)]
            raise ShardError(f"{path}: has no {INDEX_DATASET}, other shards have one")
        self.has_sentence_index = all(with_index)
        self._where = where
        # shards in line order: the first index of each (an empty shard keeps its place after those before it)
        first = {}
        for index, number in where.items():
            first[number] = min(first.get(number, index), index)
        self._order = sorted(range(len(self.paths)), key=lambda k: (first.get(k, float("inf")), k))

    def __getitem__(self, name):
        index = int(name) if isinstance(name, (int, np.integer)) or str(name).isdigit() else None
        if index is None or index not in self._where or str(name) != str(index):
            raise KeyError(name)
        return self._files[self._where[index]][str(index)][...]

    def __iter__(self):
        return (str(i) for i in range(len(self._where)))

    def __len__(self):
        return len(self._where)

    def __contains__(self, name):
        return isinstance(name, str) and name.isdigit() and str(int(name)) == name and int(name) in self._where

    def file_of(self, name):
        """The open `h5py.File` holding dataset `name`."""
        if name not in self:
            raise KeyError(name)
        return self._files[self._where[int(name)]]

    @property
    def sentence_to_index(self):
        """`{sentence key: "line index"}` over all shards, as `embed` writes it for the whole input: keys in the
        order of their first line, a key shared by several lines mapped to the last (AllenNLP's rule)."""
        if not self.has_sentence_index:
            return None
        merged = {}
        for k in self._order:
            merged.update(json.loads(self._files[k][INDEX_DATASET][0]))
        return merged

    @property
    def attrs(self):
        """The root attributes of the first shard (embed's, the same in every shard)."""
        return dict(self._files[self._order[0]].attrs)

    def close(self):
        for f in self._files:
            f.close()
        self._files = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def open_shards(shards):
    """An `EmbeddingShards` over `shards`: a prefix (`find_shards`) or a list of shard files."""
    paths = find_shards(os.fspath(shards)) if isinstance(shards, (str, os.PathLike)) else list(shards)
    return EmbeddingShards(paths)


def merge_shards(shards, output_path, progress=None):
    """Writes the shards (a prefix or a list of files, see `open_shards`) as one embed output file at `output_path`:
    the same datasets (copied as stored: dtype, shape and attributes), the root attributes of the first shard, and
    `sentence_to_index` over all lines (`EmbeddingShards.sentence_to_index`). Written under a temporary name and
    renamed at the end (`elmo_tf.io.atomic.atomic_hdf5`). Returns the number of datasets written.

    Raises:
        ShardError: see `EmbeddingShards`; WriteError: a full disk (the temporary is removed).
    """
    with open_shards(shards) as source:
        resolved = {os.path.realpath(p) for p in source.paths}
        if os.path.realpath(output_path) in resolved:
            raise ShardError(f"{output_path}: is one of the shards; it would be destroyed")
        with atomic_hdf5(output_path) as out:
            for key, value in source.attrs.items():
                out.attrs[key] = value
            for n, name in enumerate(source):
                source.file_of(name).copy(name, out, name=name)
                if progress and (n + 1) % 1000 == 0:
                    progress(1000)
            index = source.sentence_to_index
            if index is not None:
                out.create_dataset(
                    INDEX_DATASET, data=np.array([json.dumps(index)], dtype=object), dtype=h5py.string_dtype()
                )
        return len(source)


__all__ = [
    "EmbeddingShards",
    "SHARD_PATTERN",
    "ShardError",
    "find_shards",
    "merge_shards",
    "open_shards",
    "shard_path",
]
