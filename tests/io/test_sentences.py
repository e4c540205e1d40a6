"""elmo_tf/io/sentences.py: sentence keys that never merge different sentences, a streaming reader, the writer."""

import codecs
import json
import os
import random
import re
import tracemalloc

import h5py
import numpy as np
import pytest

from elmo_tf.io.sentences import (
    ASCII_WHITESPACE,
    METADATA_CACHE_BYTES,
    EmbeddingWriter,
    LineKeys,
    Sentence,
    iter_sentences,
    key_to_line,
    sentence_key,
)
from elmo_tf.io.text import TextFileError
from elmo_tf.preprocessing.tokenizer import split_tokens

WS = ASCII_WHITESPACE.encode()


def json_round_trip(key):
    """What a reader of `sentence_to_index` gets back for `key`: json.dumps as the writer does, then json.loads."""
    text = json.dumps({key: "0"})
    assert text.isascii()  # lone surrogates become \udcXX escapes
    (back,) = json.loads(text)
    return back


# ---------------------------------------------------------------- sentence_key


def test_lines_that_differ_only_in_invalid_bytes_get_different_keys():
    lines = [b"caf\xe9", b"caf\xe8", "café".encode(), "caf\ufffd".encode(), b"caf", b"caf\xe9\xe9"]
    keys = [sentence_key(line) for line in lines]
    assert len(set(keys)) == len(lines)
    assert keys[:4] == ["caf\udce9", "caf\udce8", "café", "caf\ufffd"]  # not U+FFFD for the invalid bytes
    for line, key in zip(lines, keys):
        assert key_to_line(json_round_trip(key)) == line
    assert json.dumps(keys[0]) == '"caf\\udce9"'


def test_invalid_sequences_never_take_the_key_of_valid_text():
    # a UTF-8 encoded surrogate (invalid in UTF-8) must not become the surrogate that escapes a byte
    assert sentence_key(b"\xed\xb3\xa9") != sentence_key(b"\xe9")
    assert sentence_key(b"\xed\xb3\xa9") == "\udced\udcb3\udca9"
    assert sentence_key(b"\xc3") != sentence_key(b"\xc3\xa9") != sentence_key(b"\xa9")
    assert sentence_key(b"\xc3\xa9") == "é"


def test_only_ascii_whitespace_is_stripped():
    assert sentence_key(b" \t\x0b\x0c\rthe  cat\t\r\n") == "the  cat"
    nbsp = "\u00a0".encode()
    for line in (nbsp + b"x", b"x" + nbsp, b" " + nbsp + b"x " + nbsp + b" ", "x\u2003".encode(), b"x\x1c", b"\x85x"):
        assert sentence_key(line) != sentence_key(b"x")
        assert split_tokens(line) != [b"x"]  # the tokenizer keeps them inside tokens
        assert key_to_line(sentence_key(line)) == line.strip(WS)
    assert sentence_key(nbsp + b"x ") == "\u00a0x"


def test_the_key_is_allennlps_for_valid_utf8_without_other_whitespace_at_the_ends():
    for text in ["The cat sat .", "  naïve 日本語\t", "x\u00a0y", "\tx\x1cy ", "", "   "]:
        assert sentence_key(text.encode()) == text.strip()
    assert "x\u00a0".strip() != sentence_key("x\u00a0".encode())  # AllenNLP would merge "x\xa0" with "x"


def test_keys_want_bytes():
    with pytest.raises(TypeError, match="line must be bytes, got str"):
        sentence_key("café")
    with pytest.raises(TypeError, match="key must be str, got bytes"):
        key_to_line(b"x")


def random_line(rng):
    """Short lines from few pieces, so that many lines collide once stripped: ASCII letters and whitespace,
    valid multi-byte UTF-8 (U+00A0, é, a CJK char, U+FFFD), lone bytes 0x80-0xFF and broken sequences."""
    pieces = [b"a", b"b", b" ", b"\t", b"\r", b"\x0b", b"\x0c", b"\n", b"\x1c", "\u00a0".encode(), "é".encode()]
    pieces += ["日".encode(), "\ufffd".encode(), b"\xc3", b"\xe6\x97", b"\xed\xb3\xa9", b"\x00"]
    line = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 5)))
    if rng.random() < 0.3:
        line += bytes([rng.randint(0x80, 0xFF)])
    return line


def test_randomized_equal_keys_only_for_equal_tokens_and_round_trip():
    rng = random.Random(20240611)
    lines = {random_line(rng) for _ in range(4000)}
    lines |= {bytes(rng.randint(0, 255) for _ in range(rng.randint(0, 8))) for _ in range(2000)}
    by_key = {}
    for line in lines:
        key = sentence_key(line)
        assert isinstance(key, str)
        assert key_to_line(key) == line.strip(WS)
        assert key_to_line(json_round_trip(key)) == line.strip(WS)
        by_key.setdefault(key, []).append(line)
    shared = [group for group in by_key.values() if len(group) > 1]
    assert len(shared) > 50  # the property below is exercised on many distinct lines sharing a key
    for group in by_key.values():
        tokens = split_tokens(group[0])
        for line in group[1:]:
            assert split_tokens(line) == tokens, group
    # and the other way round: different keys, where tokens are equal, differ only in inner whitespace
    valid = [line for line in lines if not any(0xD800 <= ord(c) <= 0xDFFF for c in sentence_key(line))]
    invalid = lines - set(valid)
    assert valid and invalid
    assert not {sentence_key(line) for line in valid} & {sentence_key(line) for line in invalid}


# ---------------------------------------------------------------- iter_sentences


def write(tmp_path, data, name="in.txt"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_iter_sentences_lines_tokens_and_line_ends(tmp_path):
    path = write(tmp_path, codecs.BOM_UTF8 + b"Hi there\r\n\n  c\td  \ncaf\xe9 \xff\r\nlast")
    sentences = list(iter_sentences(path))
    assert sentences == [
        Sentence(0, b"Hi there", [b"Hi", b"there"], False),
        Sentence(1, b"", [], False),
        Sentence(2, b"  c\td  ", [b"c", b"d"], False),
        Sentence(3, b"caf\xe9 \xff", [b"caf\xe9", b"\xff"], False),
        Sentence(4, b"last", [b"last"], False),
    ]
    assert sentences[0].tokens[0] == b"Hi"  # the byte order mark is not part of the first token


def test_iter_sentences_cuts_long_sentences(tmp_path):
    path = write(tmp_path, b"a b c d\na b\n\na b c\n")
    got = [(s.tokens, s.truncated) for s in iter_sentences(path, max_sentence_tokens=3)]
    assert got == [([b"a", b"b", b"c"], True), ([b"a", b"b"], False), ([], False), ([b"a", b"b", b"c"], False)]
    assert [s.line for s in iter_sentences(path, max_sentence_tokens=1)][0] == b"a b c d"


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "3"])
def test_iter_sentences_rejects_a_bad_limit_when_called(tmp_path, bad):
    with pytest.raises(ValueError, match=f"max_sentence_tokens must be None or an int >= 1, got {bad!r}"):
        iter_sentences(tmp_path / "not even read.txt", max_sentence_tokens=bad)


@pytest.mark.parametrize(
    "data,needle",
    [
        ("a b\n".encode("utf-16"), ":1: starts with a UTF-16/UTF-32 byte order mark"),
        (b"one\ntwo\nthr\x00ee\n", ":3: NUL byte at byte offset 11"),
    ],
    ids=["utf16", "nul"],
)
def test_iter_sentences_refuses_wide_and_binary_files(tmp_path, data, needle):
    path = write(tmp_path, data)
    with pytest.raises(TextFileError, match="^" + re.escape(f"{path}{needle}")):
        list(iter_sentences(path))
    with pytest.raises(TextFileError, match="missing.txt: No such file"):
        list(iter_sentences(tmp_path / "missing.txt"))


@pytest.mark.slow
def test_iter_sentences_streams_the_file(tmp_path):
    """10 MB of lines read with a few kB of memory: nothing is kept between lines."""
    line = b"the quick brown fox jumps over the lazy dog " * 2 + b"\n"
    path = tmp_path / "big.txt"
    with open(path, "wb") as f:
        for _ in range(12):
            f.write(line * 11_000)
    size = os.path.getsize(path)
    assert size > 10_000_000
    tracemalloc.start()
    try:
        count = tokens = 0
        for sentence in iter_sentences(path, max_sentence_tokens=5):
            count += 1
            tokens += len(sentence.tokens)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 132_000 and tokens == 5 * count
    assert peak < 1_000_000, f"peak {peak} bytes while reading {size} bytes"


def test_iter_sentences_is_lazy(tmp_path):
    path = write(tmp_path, b"a\nb\nc\x00\n")
    sentences = iter_sentences(path)
    assert next(sentences).tokens == [b"a"] and next(sentences).tokens == [b"b"]  # the NUL on line 3 not read yet
    with pytest.raises(TextFileError, match=":3: NUL"):
        next(sentences)


# ---------------------------------------------------------------- EmbeddingWriter


def read(path):
    with h5py.File(path, "r") as f:
        arrays = {key: f[key][...] for key in f if key != "sentence_to_index"}
        index = json.loads(f["sentence_to_index"][0]) if "sentence_to_index" in f else None
    return arrays, index


def test_writer_writes_datasets_and_the_index(tmp_path):
    out = tmp_path / "out.hdf5"
    lines = [b"the cat", b"caf\xe9", b"caf\xe8", b"  the cat  ", b"", "naïve".encode()]
    with EmbeddingWriter(out) as writer:
        assert not out.exists()
        for i, line in enumerate(lines):
            writer.write(i, np.full((3, len(split_tokens(line)), 4), i, np.float64))
            writer.add_key(i, line)
        assert writer.written == len(lines)
    arrays, index = read(out)
    assert sorted(arrays, key=int) == [str(i) for i in range(len(lines))]
    for i, line in enumerate(lines):
        assert arrays[str(i)].dtype == np.float32
        assert arrays[str(i)].shape == (3, len(split_tokens(line)), 4)
        assert (arrays[str(i)] == i).all()
    # "the cat" and "  the cat  " share a key: the last one wins, as in AllenNLP
    # built from pairs: ruff cannot hold lone surrogates and takes the two caf keys of a dict literal as one (F601)
    assert index == dict([("the cat", "3"), ("caf\udce9", "1"), ("caf\udce8", "2"), ("", "4"), ("naïve", "5")])
    assert {key_to_line(k) for k in index} == {line.strip() for line in lines}
    assert sorted(os.listdir(tmp_path)) == ["out.hdf5"]


def test_writer_without_index_is_allennlps_forget_sentences(tmp_path):
    with EmbeddingWriter(tmp_path / "out.hdf5", index=False) as writer:
        writer.write(0, np.zeros((0, 4)))
        writer.add_key(0, b"")
    arrays, index = read(tmp_path / "out.hdf5")
    assert index is None and list(arrays) == ["0"] and arrays["0"].shape == (0, 4)


def test_writer_writes_the_index_as_allennlp_does(tmp_path):
    """`sentence_to_index` as AllenNLP's `embed_file` writes it (and embed.py before the writer): a dataset of shape
    (1,) and variable-length str dtype holding the JSON map. Datasets: float32, named by line index."""
    lines = [b"The cat sat .", b"", "naïve 日本語".encode(), b"Hi", b"Hi"]
    keys = {}
    with h5py.File(tmp_path / "reference.hdf5", "w") as ref:
        for i, line in enumerate(lines):
            ref.create_dataset(str(i), data=np.full((len(line.split()), 4), i, np.float32))
            keys[line.decode().strip()] = str(i)
        ref.create_dataset("sentence_to_index", (1,), dtype=h5py.special_dtype(vlen=str))[0] = json.dumps(keys)
    with EmbeddingWriter(tmp_path / "out.hdf5") as writer:
        for i, line in enumerate(lines):
            writer.write(i, np.full((len(line.split()), 4), i, np.float64))
            writer.add_key(i, line)
    with h5py.File(tmp_path / "reference.hdf5", "r") as ref, h5py.File(tmp_path / "out.hdf5", "r") as out:
        assert sorted(out) == sorted(ref)
        for name in ref:
            assert out[name].dtype == ref[name].dtype and out[name].shape == ref[name].shape, name
            if name != "sentence_to_index":
                np.testing.assert_array_equal(out[name][...], ref[name][...])
        assert h5py.check_string_dtype(out["sentence_to_index"].dtype).encoding == "utf-8"
        assert out["sentence_to_index"].asstr()[0] == ref["sentence_to_index"].asstr()[0] == json.dumps(keys)
    assert keys == {"The cat sat .": "0", "": "1", "naïve 日本語": "2", "Hi": "4"}


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt, SystemExit])
def test_an_error_leaves_the_previous_output_and_no_temporary(tmp_path, error):
    out = tmp_path / "out.hdf5"
    out.write_bytes(b"the previous output")
    with pytest.raises(error):
        with EmbeddingWriter(out) as writer:
            writer.write(0, np.ones((2, 4)))
            writer.add_key(0, b"x y")
            assert len(os.listdir(tmp_path)) == 2  # out.hdf5 and the temporary
            raise error(143) if error is SystemExit else error()
    assert out.read_bytes() == b"the previous output"
    assert os.listdir(tmp_path) == ["out.hdf5"]
    with pytest.raises(ValueError):
        with EmbeddingWriter(tmp_path / "new.hdf5") as writer:
            writer.write(0, np.ones((2, 4)))
            writer.write(0, np.ones((2, 4)))
    assert os.listdir(tmp_path) == ["out.hdf5"]


def test_writer_removes_stale_temporaries_and_keeps_live_ones(tmp_path):
    stale = tmp_path / ".out.hdf5.tmp-999999999-0123abcd"
    live = tmp_path / f".out.hdf5.tmp-{os.getppid()}-0123abcd"
    stale.write_bytes(b"half a file")
    live.write_bytes(b"another run, still going")
    with EmbeddingWriter(tmp_path / "out.hdf5") as writer:
        writer.write(0, np.ones((1, 4)))
    assert sorted(os.listdir(tmp_path)) == sorted([live.name, "out.hdf5"])


def test_writer_misuse(tmp_path):
    writer = EmbeddingWriter(tmp_path / "out.hdf5")
    with pytest.raises(RuntimeError, match="not open"):
        writer.write(0, np.ones((1, 4)))
    with writer:
        writer.write(0, np.ones((1, 4)))
        with pytest.raises(ValueError, match="index 0 is already written"):
            writer.write(0, np.ones((1, 4)))
        for bad in (-1, True, "1", 1.0):
            with pytest.raises(ValueError, match="index must be an int >= 0"):
                writer.write(bad, np.ones((1, 4)))
            with pytest.raises(ValueError, match="index must be an int >= 0"):
                writer.add_key(bad, b"x")
        with pytest.raises(RuntimeError, match="already open"):
            writer.__enter__()
    assert writer.written == 1
    with pytest.raises(RuntimeError, match="not open"):
        writer.add_key(1, b"x")


def keys_of(lines):
    """`sentence_to_index` as `EmbeddingWriter.add_key` builds it for `lines`, in order."""
    keys = {}
    for i, line in enumerate(lines):
        keys[sentence_key(line)] = str(i)
    return keys


def line_keys(path, lines):
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    keys = LineKeys(path)
    for line in lines:
        keys.add(line)
    return keys


def test_line_keys_give_the_json_text_of_the_writers_dict(tmp_path):
    """The text `json.dumps` writes for the dict of `add_key` (each key once, at its first line, mapping to its last
    line), byte for byte: repeats near and far, keys equal once their ASCII whitespace ends go, invalid UTF-8, JSON's
    escapes, an empty line; and random lines with many repeats."""
    lines = [
        b"the cat",
        b"caf\xe9",
        b" the cat\t",
        b"",
        b'say "hi" \\ \x01',
        b"caf\xe9",
        "na\u00efve \u65e5".encode(),
        b"x",
    ]
    lines += [b"\x0bthe cat", b"", b"x\xa0"]
    assert line_keys(tmp_path / "a.txt", lines).json_text() == json.dumps(keys_of(lines)).encode()
    rng = random.Random(7)
    words = [b"a", b"b", b"c\xff", "\u00e9".encode(), b"d"]
    lines = [
        b" ".join(rng.choice(words) for _ in range(rng.randint(0, 3))) + rng.choice([b"", b" "]) for _ in range(3000)
    ]
    assert len(set(lines)) < 500  # many repeats
    keys = line_keys(tmp_path / "b.txt", lines)
    assert len(keys) == 3000
    assert keys.json_text() == json.dumps(keys_of(lines)).encode()
    assert line_keys(tmp_path / "empty.txt", []).json_text() == b"{}"


def test_line_keys_refuse_a_file_that_changed(tmp_path):
    lines = [b"one", b"two", b"three"]
    keys = line_keys(tmp_path / "a.txt", lines)
    (tmp_path / "a.txt").write_bytes(b"one\ntwo!\nthree\n")
    with pytest.raises(TextFileError, match=r"a\.txt:2: the file changed"):
        keys.json_text()
    (tmp_path / "a.txt").write_bytes(b"one\ntwo\n")
    with pytest.raises(TextFileError, match=r"a\.txt: the file changed.*now 2 lines, was 3"):
        keys.json_text()
    (tmp_path / "a.txt").write_bytes(b"one\ntwo\nthree\nfour\n")
    with pytest.raises(TextFileError, match=r"a\.txt:4: the file changed"):
        keys.json_text()


def test_line_keys_hold_16_bytes_a_line(tmp_path):
    """Memory that grows with the file is 16 bytes a line (the writer's dict of the same keys: about 200)."""
    lines = [f"line number {i} of a corpus , with some words in it".encode() for i in range(50_000)]
    path = tmp_path / "a.txt"
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    keys = LineKeys(path)
    tracemalloc.start()
    try:
        for line in lines:
            keys.add(line)
        grown, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert grown < 50_000 * 16 * 1.2, grown
    assert json.loads(keys.json_text()) == keys_of(lines)


def test_writer_writes_index_text_as_it_writes_its_dict(tmp_path):
    """`set_index_text(LineKeys.json_text())` gives the same file, byte for byte, as `add_key` for every line."""
    lines = [b"the cat", b"", b"caf\xe9", b"the cat "]
    keys = line_keys(tmp_path / "in.txt", lines)
    for name, text in (("dict.hdf5", None), ("text.hdf5", keys.json_text())):
        with EmbeddingWriter(tmp_path / name) as writer:
            for i, line in enumerate(lines):
                writer.write(i, np.full((len(split_tokens(line)), 4), i, np.float32))
                if text is None:
                    writer.add_key(i, line)
            if text is not None:
                writer.set_index_text(text)
    assert (tmp_path / "dict.hdf5").read_bytes() == (tmp_path / "text.hdf5").read_bytes()
    with EmbeddingWriter(tmp_path / "c.hdf5") as writer:
        with pytest.raises(TypeError, match="text must be bytes, got str"):
            writer.set_index_text("{}")
        writer.set_index_text(b"{}")
        with pytest.raises(ValueError, match="sentence_to_index is already written"):
            writer.set_index_text(b"{}")


@pytest.mark.slow
def test_writer_keeps_hdf5s_metadata_cache_small(tmp_path):
    """Over thousands of datasets, the open file's metadata cache stays at `METADATA_CACHE_BYTES` (HDF5 lets it grow
    to 32 MiB by default), and the file reads back whole."""
    with EmbeddingWriter(tmp_path / "out.hdf5") as writer:
        for i in range(20_000):
            writer.write(i, np.full((1, 2), i, np.float32))
            writer.add_key(i, str(i).encode())
        max_size, _, size, _ = writer._file.id.get_mdc_size()
    assert max_size == METADATA_CACHE_BYTES and size <= METADATA_CACHE_BYTES, (max_size, size)
    arrays, index = read(tmp_path / "out.hdf5")
    assert len(arrays) == len(index) == 20_000 and arrays["19999"][0, 1] == 19_999


def test_writer_copies_datasets_as_stored_or_cast(tmp_path):
    """`copy` takes a dataset of another embed output: as stored when it has the writer's dtype, read and cast when
    not; the values are the source's either way, and an index is written once."""
    values = np.random.default_rng(0).standard_normal((3, 5, 4)).astype(np.float32)
    with EmbeddingWriter(tmp_path / "a.hdf5") as writer:
        writer.write(7, values)
    for dtype in ("float32", "float16"):
        with EmbeddingWriter(tmp_path / f"b-{dtype}.hdf5", dtype=dtype) as writer, h5py.File(tmp_path / "a.hdf5") as f:
            writer.copy(f, "7")
            with pytest.raises(ValueError, match="index 7 is already written"):
                writer.copy(f, "7")
            assert writer.written == 1
        arrays, _ = read(tmp_path / f"b-{dtype}.hdf5")
        assert list(arrays) == ["7"] and arrays["7"].dtype == dtype
        np.testing.assert_array_equal(arrays["7"], values.astype(dtype))
