"""The embed command's input and output, streamed: sentences read once line by line, embeddings written as they come.

Input: one whitespace-tokenized sentence per line of a text file, read with `elmo_tf.io.text.raw_lines` (a UTF-8
byte order mark skipped, "\\n" or "\\r\\n" line ends, UTF-16/UTF-32 and NUL bytes refused; other bytes kept as they
are, invalid UTF-8 included) and split with `elmo_tf.preprocessing.tokenizer.split_tokens` (ASCII whitespace, as the
graph's `tf.strings.split`).

Output (AllenNLP's `embed_file` format): an hdf5 file with one float32 (or float16) dataset per line, named by the line
index ("0", "1", ...), and `sentence_to_index`, a one-element string dataset holding the JSON map
`{sentence key: "line index"}`.

Sentence keys. AllenNLP keys a sentence by `line.strip()` of its UTF-8 text. Here a key must never be shared by two
lines whose tokens differ, whatever their bytes, so `sentence_key`:
    1. decodes the line as UTF-8 with "surrogateescape": each byte of an invalid sequence (0x80-0xFF) becomes one
       lone surrogate U+DC80-U+DCFF. This is a bijection between byte strings and its results, and no valid UTF-8
       text decodes to a lone surrogate, so an invalid line never gets the key of a valid line nor of another
       invalid line;
    2. strips ASCII whitespace only (b" \\t\\n\\r\\x0b\\x0c", the separators of `split_tokens`). `str.strip()`
       would also strip U+00A0, U+2003 ... and the ASCII separators U+001C-U+001F, which the tokenizer keeps inside
       tokens: " x\\xa0" and " x" are different sentences.
For a valid UTF-8 line with no other whitespace (`str.isspace()`) at its ends, the key IS AllenNLP's key.
`json.dumps` (with its default `ensure_ascii=True`) writes a lone surrogate as a `\\udcXX` escape; `json.loads` gives
it back, and a reader recovers the line's bytes (without the stripped ends) with
`key.encode("utf-8", "surrogateescape")`, which is `key_to_line(key)`.

Example:
    with EmbeddingWriter("out.hdf5") as writer:
        for sentence in iter_sentences("sentences.txt", max_sentence_tokens=100):
            writer.write(sentence.index, embed(sentence.tokens))
            writer.add_key(sentence.index, sentence.line)
    # out.hdf5 is complete; on an exception, Ctrl-C or SIGTERM (through elmo_tf.cli.run) it is as it was before.
"""

import contextlib
import hashlib
import io
import json
from typing import NamedTuple

from elmo_tf.errors import check_int
from elmo_tf.io.atomic import HDF5Sink, atomic_path
from elmo_tf.io.text import TextFileError, raw_lines
from elmo_tf.preprocessing.tokenizer import split_tokens

ASCII_WHITESPACE = " \t\n\r\x0b\x0c"  # what bytes.split() / tf.strings.split split on, and nothing else
_WHITESPACE_BYTES = ASCII_WHITESPACE.encode("ascii")
INDEX_DATASET = "sentence_to_index"
# The default bound on one sentence's tokens, for embed, score and beam-embed (their --max-sentence-tokens). Real
# sentences stay far below it (the longest of the treebanks and news corpora ELMo is used on hold a few hundred
# tokens), and an LSTM's context beyond a few hundred tokens changes its outputs little; what it bounds is one model
# call: a piece of 1,000 tokens is 1,002 positions of a packed row, under the default batch budget (128 x 64 rows =
# 8,192 positions), so no call, and no wait of SIGTERM for one, grows with a line (a 1,000,000-token line ran one
# call of 387 s and 3.96 GB before). embed splits a longer line into pieces, score cuts it (see each command).
DEFAULT_MAX_SENTENCE_TOKENS = 1000
# How a sentence longer than the bound is handled, as the outputs' metadata says it (the `long_sentences` root
# attribute of an embed output): "split" (embed: consecutive pieces of at most `max_sentence_tokens` tokens, each
# embedded as a sentence of its own, their vectors put back together: every token keeps its vector), "truncated"
# (cut to the first `max_sentence_tokens` tokens) or "whole" (no bound).
LONG_SENTENCES = ("split", "truncated", "whole")
# The root attributes of an embed output that describe its content (`EmbeddingWriter(attrs=...)`), the same for every
# shard of one run: a file built from shards (`EmbeddingWriter.copy`) takes them from the first shard it copies from.
CONTENT_ATTRS = ("max_sentence_tokens", "long_sentences")


def content_attrs(max_sentence_tokens, long_sentences):
    """The `CONTENT_ATTRS` of an embed output written with the bound `max_sentence_tokens` (None: no bound) and the
    behaviour `long_sentences` ("split" or "truncated"): `{"max_sentence_tokens": N, "long_sentences": ...}`, or
    `{"long_sentences": "whole"}` without a bound."""
    if max_sentence_tokens is None:
        return {"long_sentences": "whole"}
    if long_sentences not in LONG_SENTENCES[:2]:
        raise ValueError(f"long_sentences must be one of {LONG_SENTENCES[:2]}, got {long_sentences!r}")
    return {"max_sentence_tokens": int(max_sentence_tokens), "long_sentences": long_sentences}


def sentence_key(line):
    """The key of `line` (bytes, one input line) in `sentence_to_index`: UTF-8 decoded with "surrogateescape",
    ASCII whitespace stripped from both ends (see the module docstring).

    Two lines get the same key only if they are equal once their ASCII whitespace ends are stripped, hence only if
    they have the same tokens.
    """
    if not isinstance(line, (bytes, bytearray, memoryview)):
        raise TypeError(f"line must be bytes, got {type(line).__name__}")
    return bytes(line).decode("utf-8", "surrogateescape").strip(ASCII_WHITESPACE)


def key_to_line(key):
    """The bytes a `sentence_key` stands for (the line without its ASCII whitespace ends): `key` (str, as
    `json.loads` returns it) encoded as UTF-8 with "surrogateescape"."""
    if not isinstance(key, str):
        raise TypeError(f"key must be str, got {type(key).__name__}")
    return key.encode("utf-8", "surrogateescape")


class ArrayPieces:
    """The array of one long line, split into pieces (`elmo_tf.embed`): `shape` and `dtype` of the whole, and
    `pieces`, an iterable of arrays that follow one another along the token axis (-2) and make it up, computed as
    they are read. `EmbeddingWriter.write` writes them into the dataset one by one, so memory holds one piece, never
    the line's whole array; `np.asarray(pieces)` gives the whole (once: the iterable is consumed)."""

    def __init__(self, shape, dtype, pieces):
        import numpy as np

        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        self.pieces = pieces

    def __array__(self, dtype=None, copy=None):
        import numpy as np

        whole = np.concatenate(list(self.pieces), axis=-2) if self.shape[-2] else np.zeros(self.shape, self.dtype)
        if whole.shape != self.shape:
            raise ValueError(f"the pieces make an array of shape {whole.shape}, not {self.shape}")
        return whole.astype(dtype or self.dtype, copy=False)


class Sentence(NamedTuple):
    """One input line. `index`: 0-based line index (the dataset name); `line`: its bytes without the line end (and,
    for the first line, without a UTF-8 byte order mark); `tokens`: `split_tokens(line)` (bytes), cut to
    `max_sentence_tokens` when set; `truncated`: whether it was cut."""

    index: int
    line: bytes
    tokens: list
    truncated: bool


def iter_sentences(path, max_sentence_tokens=None):
    """Yields a `Sentence` per line of `path`, reading the file once, line by line (nothing is kept: memory does not
    grow with the file).

    Args:
        path: a text file, one whitespace-tokenized sentence per line (see `elmo_tf.io.text.raw_lines`).
        max_sentence_tokens: optional int >= 1; longer sentences are cut to their first `max_sentence_tokens` tokens
            (checked when called, not at the first `next`).
    Raises:
        ValueError: a bad `max_sentence_tokens`.
        elmo_tf.io.text.TextFileError: (while iterating) a missing file, a UTF-16/UTF-32 file, a NUL byte; the
            message names the file and the line.
    """
    limit = check_int("max_sentence_tokens", max_sentence_tokens, 1, allow_none=True)
    return _sentences(path, limit)


def to_sentence(index, line, limit=None):
    """The `Sentence` of `line` (bytes, without its line break) at 0-based `index`: whitespace tokens, cut to the
    first `limit` when given."""
    tokens = split_tokens(line)
    truncated = limit is not None and len(tokens) > limit
    if truncated:
        tokens = tokens[:limit]
    return Sentence(index, line, tokens, truncated)


def _sentences(path, limit):
    for number, _, line in raw_lines(path):
        yield to_sentence(number - 1, line, limit)


# HDF5 1.8's file format (2008; every h5py reads it): its groups index names in a fractal heap and a B-tree by
# hash, where the oldest format keeps every name in one local heap that outgrows a capped metadata cache and is read
# back from the file on each new dataset (merging 200,000 small datasets: 32.5 -> 19.0 s)
LIBVER = ("v108", "v108")
# HDF5 lets the metadata cache of an open file grow to 32 MiB (its default max_size): the object headers of the
# datasets written, tens of thousands in an embed output. 2 MiB is HDF5's initial size; the rest is written out as
# it goes (bench/README.md, "Corpus scale").
METADATA_CACHE_BYTES = 2 << 20


def cap_metadata_cache(f):
    """Caps the metadata cache of `f`, an open h5py file (written or read), at `METADATA_CACHE_BYTES`."""
    config = f.id.get_mdc_config()
    config.max_size = METADATA_CACHE_BYTES
    config.min_size = min(config.min_size, METADATA_CACHE_BYTES)
    config.initial_size = min(config.initial_size, METADATA_CACHE_BYTES)
    f.id.set_mdc_config(config)


class EmbeddingWriter:
    """Writes the embed output hdf5 as embeddings come, under a temporary name renamed into place at the end.

    Args:
        output_path: the hdf5 file to write (its directory must exist); an existing file is replaced whole, at the
            end of a clean `with` block only.
        index: write `sentence_to_index` (False: leave it out, like AllenNLP's `forget_sentences`; keys are then
            not even kept in memory).
        dtype: of every sentence dataset, "float32" (default) or "float16" (half the file; values rounded to the
            nearest float16).
        durable: the file is on the disk (fsync'd, as is its directory entry) once the block has ended
            (`elmo_tf.io.atomic.atomic_path`).
        attrs: optional `{name: value}` written as the file's root attributes (`content_attrs`: how long sentences
            were handled). Without them, the first `copy` takes the `CONTENT_ATTRS` of the file it copies from.
    Attributes:
        written: how many sentence datasets `write` created.
    The temporary is `.<output name>.tmp-<pid>-<random>` beside the output (`elmo_tf.io.atomic.atomic_path`, which
    also removes the temporaries of dead processes first). On any exception leaving the block (KeyboardInterrupt and
    SystemExit included) the temporary is removed and an existing output is left untouched. A write the disk refuses
    (full: ENOSPC; a file-size limit: EFBIG) raises `elmo_tf.io.atomic.WriteError` naming the output from the `write`
    that met it, and ends the same way (the file goes through an `elmo_tf.io.atomic.HDF5Sink`). The key map is held
    in memory until the end (one JSON string, as AllenNLP writes it): it grows with the number of distinct keys.
    """

    def __init__(self, output_path, index=True, dtype="float32", durable=False, attrs=None):
        import numpy as np

        self.output_path = output_path
        self.attrs = dict(attrs or {})
        self.index = bool(index)
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.float32, np.float16):
            raise ValueError(f"dtype must be float32 or float16, got {dtype!r}")
        self.durable = bool(durable)
        self.written = 0
        self._keys = {}
        self._index_written = False
        self._attrs_taken = False
        self._file = None
        self._sink = None
        self._stack = None

    def __enter__(self):
        import h5py

        if self._stack is not None:
            raise RuntimeError(f"EmbeddingWriter for {self.output_path!r} is already open")
        with contextlib.ExitStack() as stack:
            tmp = stack.enter_context(atomic_path(self.output_path, durable=self.durable))
            self._sink = stack.enter_context(HDF5Sink(tmp, self.output_path))  # closed after the file, on any exit
            self._file = stack.enter_context(h5py.File(self._sink, "w", libver=LIBVER))
            cap_metadata_cache(self._file)
            for name, value in self.attrs.items():
                self._file.attrs[name] = value
            self._stack = stack.pop_all()
        self.written = 0
        self._keys = {}
        self._index_written = False
        self._attrs_taken = bool(self.attrs)
        return self

    def __exit__(self, exc_type, exc, tb):
        stack, self._stack = self._stack, None
        try:
            if exc_type is not None:
                return stack.__exit__(exc_type, exc, tb)  # closes the file, removes the temporary
            with stack:  # an error here (or while closing) removes the temporary too
                if self.index and not self._index_written:
                    self._write_index(json.dumps(self._keys))
                self._sink.check()
                self._file.close()  # its last metadata goes through the sink, checked once it is closed
                self._sink.close()
                self._sink.check()
            return False
        finally:
            self._file = self._sink = None

    def _check_open(self):
        if self._file is None:
            raise RuntimeError("EmbeddingWriter is not open: use it in a `with` block")

    @staticmethod
    def _name(index):
        return str(check_int("index", index, 0))

    def _create(self, index, create):
        """Runs `create(name)`, which makes the dataset of `index` (a new name: each index is written once). HDF5
        refuses a name that exists; only then is it looked up, for the error naming it (a lookup before every
        dataset cost 0.4 s of a 20,000-dataset merge)."""
        self._check_open()
        name = self._name(index)
        try:
            create(name)
        except (ValueError, RuntimeError):  # h5py's errors for "name already exists" (create) / "exists" (copy)
            if name in self._file:
                raise ValueError(f"index {name} is already written to {self.output_path}") from None
            raise
        self._sink.check()
        self.written += 1

    def write(self, index, array):
        """Creates the dataset `str(index)` holding `array` as `dtype` (any shape: `(L+1, tokens, 2P)` for all
        layers, `(tokens, 2P)` for one). Each index is written once. An `ArrayPieces` is written piece by piece
        (memory holds one piece); its pieces must make up its shape exactly (ValueError otherwise)."""
        import numpy as np

        if isinstance(array, ArrayPieces):
            made = []
            self._create(index, lambda name: made.append(self._file.create_dataset(name, array.shape, self.dtype)))
            self._write_pieces(made[0], array)
            return
        array = np.asarray(array, dtype=self.dtype)
        self._create(index, lambda name: self._file.create_dataset(name, data=array))

    def _write_pieces(self, dataset, array):
        import numpy as np

        at, total = 0, array.shape[-2]
        for piece in array.pieces:
            piece = np.asarray(piece, dtype=self.dtype)
            n = piece.shape[-2]
            if piece.shape[:-2] + piece.shape[-1:] != array.shape[:-2] + array.shape[-1:] or at + n > total:
                raise ValueError(f"a piece of shape {piece.shape} does not fit {array.shape} at token {at}")
            if n:
                dataset[..., at : at + n, :] = piece
            at += n
            self._sink.check()
        if at != total:
            raise ValueError(f"the pieces of dataset {dataset.name} hold {at} tokens, not {total}")

    def copy(self, source, name):
        """Copies the dataset `name` (a line index, as `write` names it) of `source`, an open h5py file (another
        embed output, a shard), into this file. Stored in the writer's dtype already, it is copied as stored, in one
        HDF5 call (H5Ocopy: no array goes through Python; about 2.7x as fast on 20,000 datasets); else it is read
        and written cast, as `write` does."""
        import h5py

        index = int(name)
        if not self._attrs_taken:  # the first file copied from says how its content was made
            self._attrs_taken = True
            for attr in CONTENT_ATTRS:
                if attr in source.attrs and attr not in self._file.attrs:
                    self._file.attrs[attr] = source.attrs[attr]
        if h5py.h5d.open(source.id, name.encode()).dtype != self.dtype:
            self.write(index, source[name][...])
            return
        self._create(index, lambda target: h5py.h5o.copy(source.id, name.encode(), self._file.id, target.encode()))

    def add_key(self, index, line):
        """Records `sentence_key(line) -> str(index)` for `sentence_to_index`; a later line with the same key
        replaces an earlier one, as in AllenNLP. Nothing is recorded when `index` is False."""
        self._check_open()
        name = self._name(index)
        key = sentence_key(line)
        if self.index:
            self._keys[key] = name

    def set_index_text(self, text):
        """Writes `text` (bytes: UTF-8 JSON, `LineKeys.json_text`) as `sentence_to_index` now, instead of the keys
        recorded with `add_key` at the end; for maps too large to hold as a dict (written first, its
        copies are freed before the datasets' metadata builds up). Ignored when `index` is False."""
        self._check_open()
        if not isinstance(text, bytes):
            raise TypeError(f"text must be bytes, got {type(text).__name__}")
        if self._index_written:
            raise ValueError(f"{INDEX_DATASET} is already written to {self.output_path}")
        if self.index:
            self._write_index(text)

    def _write_index(self, text):
        import h5py
        import numpy as np

        self._file.create_dataset(INDEX_DATASET, data=np.array([text], dtype=object), dtype=h5py.string_dtype())
        self._index_written = True
        self._sink.check()


def key_digest(key):
    """The 16-byte BLAKE2b digest that stands for `key` (a `sentence_key`, str) in `LineKeys` and
    `elmo_tf.io.embeddings_shards.merged_index_text`: equal keys, equal digests."""
    return hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=LineKeys.DIGEST_SIZE).digest()


def first_and_last(digests, values):
    """For n entries, each a 16-byte digest (`digests`: their concatenation, in order) and an int (`values`):
    `(first, last)`: bool `(n,)`, True at the first entry of each digest, and int64 `(n,)`, at those entries, the
    largest value among the digest's entries (its last line, when the values are line indices)."""
    import numpy as np

    n = len(values)
    words = np.frombuffer(digests, dtype="<u8").reshape(n, 2)
    order = np.lexsort((words[:, 1], words[:, 0]))  # stable: equal digests stay in entry order
    ordered = words[order]
    starts = np.ones(n, bool)
    starts[1:] = (ordered[1:] != ordered[:-1]).any(axis=1)
    del ordered
    begin = np.flatnonzero(starts)
    first = np.zeros(n, bool)
    first[order[begin]] = True
    last = np.empty(n, np.int64)
    last[order[begin]] = np.maximum.reduceat(np.asarray(values, np.int64)[order], begin)
    return first, last


def json_member(key, index):
    """`"key": "index"` as `json.dumps` writes it in a dict (UTF-8 bytes, ASCII: non-ASCII is escaped)."""
    return json.dumps(key).encode("ascii") + b': "' + str(int(index)).encode() + b'"'


class LineKeys:
    """The `sentence_to_index` of a text file's lines, kept in 16 bytes a line rather than as a dict of the keys.

    `add(line)` takes the file's lines in order (`Sentence.line` of line index 0, 1, ...). `json_text()` then reads
    the file again and returns, as UTF-8 bytes, the JSON text `json.dumps` gives for the dict that `add_key` builds
    from those lines (each key once, in the order of its first line, mapping to its last line's index): the same
    bytes as `EmbeddingWriter` writes from its own dict. Memory: 16 bytes a line while adding (a dict of the keys of
    100,000 lines of news text holds about 28 MiB; this, 1.6 MiB), about 40 bytes a line and the JSON text while
    `json_text` runs.

    Two lines share a key when their 128-bit BLAKE2b digests of `key_to_line(sentence_key(line))` are equal:
    different keys collide with probability about n^2 / 2^129 for n lines (1e-21 at a billion lines).

    Raises (`json_text`): `elmo_tf.io.text.TextFileError` naming the file and line when the file no longer holds the
    lines added (changed since), or when it cannot be read.
    """

    DIGEST_SIZE = 16

    def __init__(self, path):
        self.path = path
        self._digests = bytearray()

    def __len__(self):
        return len(self._digests) // self.DIGEST_SIZE

    @classmethod
    def _digest(cls, line):
        return hashlib.blake2b(bytes(line).strip(_WHITESPACE_BYTES), digest_size=cls.DIGEST_SIZE).digest()

    def add(self, line):
        """Records the key of the next line (bytes, without its line end)."""
        self._digests += self._digest(line)

    def json_text(self):
        """The JSON text of the map (see the class), as UTF-8 bytes (ASCII: `json.dumps` escapes the rest)."""
        import numpy as np

        n, size = len(self), self.DIGEST_SIZE
        first, last = first_and_last(self._digests, np.arange(n)) if n else (None, None)
        out = io.BytesIO()
        out.write(b"{")
        separator = b""
        count = 0
        for number, _, line in raw_lines(self.path):
            index = number - 1
            if index >= n or self._digests[index * size : (index + 1) * size] != self._digest(line):
                raise TextFileError(f"{self.path}:{number}: the file changed while it was read; run again")
            if first[index]:
                out.write(separator + json_member(sentence_key(line), last[index]))
                separator = b", "
            count = number
        if count != n:
            raise TextFileError(
                f"{self.path}: the file changed while it was read (now {count} lines, was {n}); run again"
            )
        out.write(b"}")
        return out.getvalue()


__all__ = [
    "ASCII_WHITESPACE",
    "ArrayPieces",
    "CONTENT_ATTRS",
    "DEFAULT_MAX_SENTENCE_TOKENS",
    "LONG_SENTENCES",
    "content_attrs",
    "EmbeddingWriter",
    "METADATA_CACHE_BYTES",
    "LineKeys",
    "Sentence",
    "cap_metadata_cache",
    "first_and_last",
    "iter_sentences",
    "json_member",
    "key_digest",
    "key_to_line",
    "sentence_key",
    "to_sentence",
]
