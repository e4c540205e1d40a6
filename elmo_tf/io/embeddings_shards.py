"""Sets of embed output shards (`PREFIX-SSSSS-of-NNNNN.hdf5`, written by `elmo_tf.beam`) read as one mapping, and
merged into one file equal to `embed`'s.

Each shard is a valid `embed` output for a contiguous range of input lines: datasets named by the line index in the
whole input ("0", "1", ...), and `sentence_to_index` for its own lines. Shard k holds the lines `i` with
`i * NNNNN // total == k`, so the shards in order hold the lines in order (a shard may be empty when there are more
shards than lines).

Each shard also carries, as root attributes (`shard_attrs`), its run's fingerprint, one attribute per entry named
`run.<entry>` holding the entry's JSON text (`run.model`, `run.layers`, `run.dtype`, `run.precision`, `run.input`,
the settings...: see `elmo_tf.beam.pipeline.shard_fingerprint`), and its place in the set: `shard.index` and
`shard.count`. `merge_shards` refuses, in one line naming the file, the attribute and both values, shards whose
fingerprints differ (two runs), a set that is not complete (a shard missing, the same index twice, counts that
disagree), and shards without a fingerprint (written before shards carried one: run beam-embed again).

Example:
    with open_shards("out/emb") as shards:          # out/emb-00000-of-00004.hdf5 ... (or a list of paths)
        vectors = shards["12"]                       # read from its shard when asked, nothing loaded before
        index = shards.sentence_to_index            # {sentence key: "line index"}, as embed writes it
    merge_shards("out/emb", "all.hdf5")              # one file, as `embed` writes it
"""

import array
import collections.abc
import glob
import io
import json
import os
import re

import h5py
import numpy as np

from elmo_tf.errors import ElmoTFError
from elmo_tf.io.hdf5_safety import check_self_contained
from elmo_tf.io.journal import fault_point
from elmo_tf.io.sentences import (
    CONTENT_ATTRS,
    INDEX_DATASET,
    EmbeddingWriter,
    cap_metadata_cache,
    first_and_last,
    json_member,
    key_digest,
)

OPEN_FILES = 32  # shard files an EmbeddingShards keeps open at once
PROGRESS_EVERY = 1000  # datasets copied between two calls of write_shards' progress
SHARD_PATTERN = re.compile(r"^(?P<prefix>.*)-(?P<shard>\d{5})-of-(?P<count>\d{5})\.hdf5$")
FINGERPRINT_PREFIX = "run."  # a root attribute per entry of the run's fingerprint: its JSON text
SHARD_INDEX = "shard.index"  # the shard's place in its set (0-based) ...
SHARD_COUNT = "shard.count"  # ... of this many shards
# the entries named first when two fingerprints differ (the others follow in name order)
FINGERPRINT_ORDER = ("model", "layers", "dtype", "precision", "input", "token_embeddings")
# the root attribute of an embed output (a shard, a merged file) saying what its arrays were computed in: "float32" or
# "bfloat16" (`elmo_tf.precision`); a merged file takes it, with `CONTENT_ATTRS`, from its first shard
PRECISION_ATTR = "precision"
CARRIED_ATTRS = (*CONTENT_ATTRS, PRECISION_ATTR)


class ShardError(ElmoTFError):
    """A set of shards that is not one embed output: missing or foreign shards, overlapping or missing line
    indices. The message names the files and the index."""


def shard_path(prefix, shard, num_shards):
    """`PREFIX-SSSSS-of-NNNNN.hdf5` (Beam's default shard name template, with the .hdf5 suffix)."""
    return f"{prefix}-{shard:05d}-of-{num_shards:05d}.hdf5"


def shard_attrs(fingerprint, shard, num_shards):
    """The root attributes of shard `shard` of `num_shards` of a run whose fingerprint is `fingerprint` (a dict of
    JSON-serializable values): `run.<entry>` (the entry's JSON text, keys sorted) for each entry, `shard.index` and
    `shard.count` (ints)."""
    attrs = {FINGERPRINT_PREFIX + key: json.dumps(value, sort_keys=True) for key, value in fingerprint.items()}
    attrs[SHARD_INDEX] = int(shard)
    attrs[SHARD_COUNT] = int(num_shards)
    return attrs


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

    Only the dataset names are read when opened, one file at a time (no object is opened: HDF5 keeps memory for each
    object opened in a file while it is open); an array is read from its shard when asked for. At most `OPEN_FILES`
    shards are open at once (the least recently read is closed first), each with its metadata cache capped, so a
    set of thousands of shards stays within the usual limit of 1,024 open files; `close()` (or the end of a `with`
    block) closes them. Memory: 4 bytes a line (its shard's number).

    Args:
        paths: the shard files (any order: they are ordered by their first line index).
        require_fingerprint: refuse shards without their run's fingerprint (`shard_attrs`); otherwise a set where no
            shard has one (written before shards carried one, or by `write_embedding_file` alone) is read unchecked.
    Raises:
        ShardError: shards of two runs or an incomplete set (`check_shard_set`: the file, the attribute and both
            values), a line index in two shards, an index missing between 0 and the largest, shards with and without
            `sentence_to_index`, a file that is not hdf5 or holds a name that is not a line index; when an array is
            read, an object of that name that is not a dataset.
    """

    def __init__(self, paths, require_fingerprint=False):
        self.paths = [os.fspath(p) for p in paths]
        if not self.paths:
            raise ShardError("no shard files given")
        self.require_fingerprint = bool(require_fingerprint)
        self._open_files = collections.OrderedDict()  # shard number -> h5py.File, least recently used first
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    def _open(self):
        found, with_index, places = [], [], []  # per file: line indices (int64), sentence_to_index?, shard_place
        for path in self.paths:
            with _open_shard(path) as f:
                places.append(shard_place(f, path))
                found.append(_line_indices(f, path))
                with_index.append(INDEX_DATASET in f)
        check_shard_set(self.paths, places, self.require_fingerprint)
        self._shard_of = self._check_lines(found)
        if any(with_index) and not all(with_index):
            path = self.paths[with_index.index(False)]
            raise ShardError(f"{path}: has no {INDEX_DATASET}, other shards have one")
        self.has_sentence_index = all(with_index)
        # shards in line order: the first index of each (an empty shard keeps its place after those before it)
        first = [int(indices.min()) if indices.size else float("inf") for indices in found]
        self._order = sorted(range(len(self.paths)), key=lambda k: (first[k], k))

    def _check_lines(self, found):
        """The shard number of each line index 0 .. n-1 (int32 `(n,)`: 4 bytes a line) from each file's indices;
        ShardError when an index is in two files or one below the largest is in none."""
        numbers = np.repeat(np.arange(len(found), dtype=np.int32), [indices.size for indices in found])
        indices = np.concatenate(found) if found else np.zeros(0, np.int64)
        order = np.argsort(indices, kind="stable")  # equal indices stay in file order
        ordered = indices[order]
        twice = np.flatnonzero(ordered[1:] == ordered[:-1])
        if twice.size:
            k = twice[0]
            earlier, later = (self.paths[numbers[order[j]]] for j in (k, k + 1))
            raise ShardError(f"{later}: line index {ordered[k]} is also in {earlier} (overlap)")
        n = ordered.size
        if n and ordered[-1] != n - 1:
            gap = int(np.flatnonzero(ordered != np.arange(n))[0])
            raise ShardError(
                f"line index {gap} is in no shard of {len(self.paths)} ({self.paths[0]} ...): "
                f"{int(ordered[-1]) + 1 - n} missing below {ordered[-1]}"
            )
        shard_of = np.empty(n, np.int32)
        shard_of[ordered] = numbers[order]
        return shard_of

    def __getitem__(self, name):
        if isinstance(name, (int, np.integer)) and not isinstance(name, bool):
            name = str(int(name))
        dataset = self.file_of(name)[name]
        if not isinstance(dataset, h5py.Dataset):
            raise _not_a_dataset(dataset.file.filename, name)
        return dataset[...]

    def __iter__(self):
        return (str(i) for i in range(len(self)))

    def __len__(self):
        return len(self._shard_of)

    def __contains__(self, name):
        return isinstance(name, str) and name.isdigit() and str(int(name)) == name and int(name) < len(self)

    def file_of(self, name):
        """The open `h5py.File` holding dataset `name` (closed again once `OPEN_FILES` other shards are read)."""
        if name not in self:
            raise KeyError(name)
        return self._file(int(self._shard_of[int(name)]))

    def _file(self, number):
        """Shard `number`, open (opened again if it was closed to keep `OPEN_FILES`)."""
        f = self._open_files.pop(number, None)
        if f is None:
            if len(self._open_files) >= OPEN_FILES:
                self._open_files.popitem(last=False)[1].close()
            f = _open_shard(self.paths[number])
        self._open_files[number] = f
        return f

    @property
    def sentence_to_index(self):
        """`{sentence key: "line index"}` over all shards, as `embed` writes it for the whole input: keys in the
        order of their first line, a key shared by several lines mapped to the last (AllenNLP's rule)."""
        return json.loads(self.index_text()) if self.has_sentence_index else None

    def index_text(self):
        """`sentence_to_index`'s JSON text (bytes) over all shards: `merged_index_text` of the shards in line
        order; None without one."""
        return merged_index_text(self.ordered_paths) if self.has_sentence_index else None

    @property
    def ordered_paths(self):
        """The shard files in line order (by their first line index; an empty one after those before it)."""
        return [self.paths[k] for k in self._order]

    @property
    def attrs(self):
        """The root attributes of the first shard (embed's, the same in every shard)."""
        return dict(self._file(self._order[0]).attrs)

    def close(self):
        while self._open_files:
            self._open_files.popitem()[1].close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def open_shards(shards, require_fingerprint=False):
    """An `EmbeddingShards` over `shards`: a prefix (`find_shards`) or a list of shard files."""
    paths = find_shards(os.fspath(shards)) if isinstance(shards, (str, os.PathLike)) else list(shards)
    return EmbeddingShards(paths, require_fingerprint=require_fingerprint)


def shard_place(f, path):
    """`(fingerprint, index, count)` of the shard `f` (open h5py file at `path`) from its root attributes
    (`shard_attrs`): `{entry: JSON text}` ({} without one), `shard.index` and `shard.count` (None when absent);
    ShardError for an attribute of the wrong type."""
    fingerprint, place = {}, {}
    for name, value in f.attrs.items():
        if name.startswith(FINGERPRINT_PREFIX):
            if isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            if not isinstance(value, str):
                raise ShardError(f"{path}: attribute {name!r} is not text (a JSON value): {value!r}")
            fingerprint[name[len(FINGERPRINT_PREFIX) :]] = value
        elif name in (SHARD_INDEX, SHARD_COUNT):
            if not (np.ndim(value) == 0 and np.issubdtype(np.asarray(value).dtype, np.integer)):
                raise ShardError(f"{path}: attribute {name!r} is not an integer: {value!r}")
            place[name] = int(value)
    return fingerprint, place.get(SHARD_INDEX), place.get(SHARD_COUNT)


def _entries_in_order(*fingerprints):
    names = set().union(*fingerprints)
    return [n for n in FINGERPRINT_ORDER if n in names] + sorted(names - set(FINGERPRINT_ORDER))


def _shown(value):
    return "absent" if value is None else str(value)


def _missing_shard_name(paths, index, count):
    """The file name shard `index` of `count` would have beside the first of `paths` named `PREFIX-SSSSS-of-NNNNN`."""
    for path in paths:
        match = SHARD_PATTERN.match(path)
        if match:
            return shard_path(match["prefix"], index, count)
    return None


def check_shard_set(paths, places, require_fingerprint=True):
    """Raises `ShardError`, one line naming the first mismatch (the file, the attribute, both values), unless the
    shards `paths` (their `shard_place`s, in the same order) are one run's complete set: the same fingerprint
    everywhere, the same `shard.count`, every `shard.index` from 0 to count - 1 exactly once. Without
    `require_fingerprint`, a set where no shard has a fingerprint nor a place passes unchecked."""
    marked = [bool(fingerprint) and index is not None and count is not None for fingerprint, index, count in places]
    if not any(marked) and not require_fingerprint:
        return
    for path, ok in zip(paths, marked):
        if not ok:
            reason = (
                "other shards have one: shards of different runs"
                if any(marked)
                else "written before beam-embed marked its shards: run beam-embed again"
            )
            raise ShardError(
                f"{path}: no run fingerprint ({FINGERPRINT_PREFIX}* and {SHARD_INDEX}/{SHARD_COUNT} attributes); "
                + reason
            )
    (first_fingerprint, _, first_count), first = places[0], paths[0]
    for path, (fingerprint, _index, count) in zip(paths[1:], places[1:]):
        for entry in _entries_in_order(first_fingerprint, fingerprint):
            if fingerprint.get(entry) != first_fingerprint.get(entry):
                raise ShardError(
                    f"{path}: attribute {FINGERPRINT_PREFIX + entry!r} is {_shown(fingerprint.get(entry))}, "
                    f"{first} has {_shown(first_fingerprint.get(entry))}: shards of different runs"
                )
        if count != first_count:
            raise ShardError(
                f"{path}: attribute {SHARD_COUNT!r} is {count}, {first} has {first_count}: shards of different sets"
            )
    seen = {}
    for path, (_fingerprint, index, count) in zip(paths, places):
        if not 0 <= index < count:
            raise ShardError(f"{path}: attribute {SHARD_INDEX!r} is {index}, not in 0..{count - 1} ({SHARD_COUNT})")
        if index in seen:
            raise ShardError(f"{path}: attribute {SHARD_INDEX!r} is {index}, as in {seen[index]}: the same shard twice")
        seen[index] = path
    missing = [k for k in range(first_count) if k not in seen]
    if missing:
        k = missing[0]
        name = _missing_shard_name(paths, k, first_count)
        given = ", ".join(str(i) for i in sorted(seen)[:8]) + (", ..." if len(seen) > 8 else "")
        raise ShardError(
            f"{name + ': ' if name else ''}shard {k} of {first_count} is missing: the {len(paths)} files given have "
            f"{SHARD_INDEX} {given} of {SHARD_COUNT} {first_count} ({len(missing)} missing)"
        )


def _open_shard(path):
    """`path` open for reading, its metadata cache capped; ShardError when it is not an hdf5 file; an
    `elmo_tf.io.hdf5_safety` error when it refers to other files or outside storage (`check_self_contained`)."""
    try:
        f = h5py.File(path, "r")
    except OSError as e:  # an OS error (no such file, too many open files) has an errno; not hdf5 has none
        what = f"cannot be opened: {os.strerror(e.errno)}" if e.errno else "not an hdf5 file"
        raise ShardError(f"{path}: {what} ({e})") from None
    try:
        check_self_contained(f, path)
        cap_metadata_cache(f)
    except BaseException:
        f.close()
        raise
    return f


def _line_indices(f, path):
    """The line indices of the embed output `f` (open h5py file at `path`), int64, from its dataset names alone (no
    object is opened: a dataset read or copied is checked then); ShardError for a name that is not one."""
    indices = array.array("q")
    for name in f:
        if name != INDEX_DATASET:
            if not (name.isdigit() and str(int(name)) == name):
                raise _not_a_dataset(path, name)
            indices.append(int(name))
    return np.frombuffer(indices, np.int64)


def _not_a_dataset(path, name):
    return ShardError(f"{path}: {name!r} is not an embed output dataset (a line index)")


def _map_of(path):
    """The `sentence_to_index` dict of the embed output at `path`; {} without one."""
    with _open_shard(path) as f:
        return json.loads(f[INDEX_DATASET][0]) if INDEX_DATASET in f else {}


def merged_index_text(paths):
    """The `sentence_to_index` JSON text (bytes) of one file holding the lines of the embed outputs `paths`, from
    their own maps: each key once, placed by the first file whose map has it, mapping to its largest line index
    (its last line). For shards that hold consecutive line ranges, given in line order (Beam's), these are the bytes
    `embed` writes for the whole input; for files whose lines interleave, the same mapping with keys possibly in
    another order.

    Memory: 24 bytes a key of each file, one file's map at a time (each is parsed twice), and the text."""
    paths = list(paths)
    digests, values = bytearray(), array.array("q")
    for path in paths:
        for key, value in _map_of(path).items():
            digests += key_digest(key)
            values.append(int(value))
    first, last = first_and_last(digests, values) if values else (None, None)
    del digests, values
    out = io.BytesIO()
    out.write(b"{")
    entry = 0
    for path in paths:
        for key in _map_of(path):
            if first[entry]:
                out.write((b", " if out.tell() > 1 else b"") + json_member(key, last[entry]))
            entry += 1
    out.write(b"}")
    return out.getvalue()


def _carried_attrs(paths):
    """`{name: value}` of the `CARRIED_ATTRS` the first of `paths` has ({} without paths)."""
    if not paths:
        return {}
    with _open_shard(paths[0]) as f:
        return {name: f.attrs[name] for name in CARRIED_ATTRS if name in f.attrs}


def write_shards(paths, output_path, index_text=None, dtype="float32", after_index=None, progress=None):
    """Writes the datasets of the embed outputs `paths` (each line in one of them) into one file at `output_path`
    (`EmbeddingWriter`: atomic and durable): `index_text` (bytes, `merged_index_text` or `LineKeys.json_text`) as
    `sentence_to_index` first, unless None, then each file's datasets in line order, one file open at a time,
    copied as stored or cast to `dtype` (`EmbeddingWriter.copy`). Memory holds one file's dataset names and one
    dataset, whatever the number of files and lines (HDF5's metadata caches capped).

    `after_index()` runs once `sentence_to_index` is written; `progress(n)` after every `PROGRESS_EVERY` datasets
    and at the end of each file, with the datasets copied since its last call. After each file the test hook
    `fault_point("merge")` (`elmo_tf.io.journal`: the output's temporary holds k files). Returns the
    number of datasets written. The file's root attributes are the first file's `CARRIED_ATTRS` (how its content was
    made, the precision it was computed in), which the files of one run share. Raises ShardError for a file that is
    not an embed output (a name that is not a line index, an object that is not a dataset); ValueError for an index in
    two files."""
    attrs = _carried_attrs(paths)
    with EmbeddingWriter(output_path, index=index_text is not None, dtype=dtype, durable=True, attrs=attrs) as writer:
        if index_text is not None:  # first: the text and its copies are gone before the datasets' metadata builds up
            writer.set_index_text(index_text)
            if after_index:
                after_index()
        for path in paths:
            with _open_shard(path) as f:
                indices = np.sort(_line_indices(f, path))
                for k, index in enumerate(indices, 1):
                    name = str(index)
                    try:
                        writer.copy(f, name)
                    except KeyError:
                        if not isinstance(f.get(name, getclass=True), h5py.Dataset):
                            raise _not_a_dataset(path, name) from None
                        raise
                    if progress and k % PROGRESS_EVERY == 0:
                        progress(PROGRESS_EVERY)
            fault_point("merge")
            if progress and len(indices) % PROGRESS_EVERY:
                progress(len(indices) % PROGRESS_EVERY)
    return writer.written


def merge_shards(shards, output_path, progress=None, on_start=None):
    """Writes the shards (a prefix or a list of files, see `open_shards`) as one embed output file at `output_path`,
    equal to `embed`'s for the whole input: `sentence_to_index` over all lines (`EmbeddingShards.index_text`), then
    every dataset, copied as stored (`write_shards`; in the dtype of the first, which all shards of one run share).
    Memory: about 30 bytes a line while checking the shards, then the keys' text. Optional: `on_start(total)` once
    the shards are checked (the number of lines), `progress(n)` as datasets are copied (see `write_shards`).
    Returns the number of datasets written. Nothing is written unless the shards are one run's complete set, each
    with its fingerprint (`check_shard_set`).

    Raises:
        ShardError: see `EmbeddingShards` (with `require_fingerprint`), and shards whose arrays are not float32 or
        float16; WriteError: a full disk (the temporary is removed); OSError: the output's temporary cannot be
        created beside it (its directory missing, not writable, not a directory).
    """
    with open_shards(shards, require_fingerprint=True) as source:
        resolved = {os.path.realpath(p) for p in source.paths}
        if os.path.realpath(output_path) in resolved:
            raise ShardError(f"{output_path}: is one of the shards; it would be destroyed")
        dtype = source["0"].dtype if len(source) else np.dtype("float32")
        if dtype not in (np.float32, np.float16):
            raise ShardError(f"{source.file_of('0').filename}: arrays of {dtype}, not float32 or float16")
        paths, text = source.ordered_paths, source.index_text()
        if on_start:
            on_start(len(source))
    return write_shards(paths, output_path, text, dtype, progress=progress)


__all__ = [
    "CARRIED_ATTRS",
    "EmbeddingShards",
    "FINGERPRINT_PREFIX",
    "PRECISION_ATTR",
    "SHARD_COUNT",
    "SHARD_INDEX",
    "SHARD_PATTERN",
    "ShardError",
    "check_shard_set",
    "find_shards",
    "merge_shards",
    "merged_index_text",
    "open_shards",
    "shard_attrs",
    "shard_path",
    "shard_place",
    "write_shards",
]
