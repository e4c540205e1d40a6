"""elmo_tf/io/token_embeddings.py and `python -m elmo_tf dump-token-embeddings`: the context-free token vectors of
a vocabulary, in the bilm-tf / AllenNLP hdf5 layout (one float32 dataset "embedding", row j = line j + 1)."""

import codecs
import hashlib
import os
import re
from pathlib import Path

import h5py
import numpy as np
import pytest
from cli_testlib import assert_one_error, run_command

from elmo_tf.cli.main import main
from elmo_tf.io.token_cache import TokenCache
from elmo_tf.io.token_embeddings import (
    DIGEST_ATTR,
    SIZE_ATTR,
    TokenEmbeddingError,
    compute_token_embeddings,
    dump_token_embeddings,
    load_token_embeddings,
    read_vocabulary,
    vocabulary_digest,
    write_token_embeddings,
)
from elmo_tf.models import load_elmo
from elmo_tf.preprocessing.chars import BOS_CHAR_IDS, EOS_CHAR_IDS

ALLENNLP = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "elmo_fixtures" / "allennlp"
OPTIONS, WEIGHTS = ALLENNLP / "options.json", ALLENNLP / "lm_weights.hdf5"
VOCAB, CACHE = ALLENNLP / "vocab_test.txt", ALLENNLP / "elmo_token_embeddings.hdf5"
needs_fixtures = pytest.mark.skipif(not ALLENNLP.is_dir(), reason=f"fixture data not found at {ALLENNLP}")
ATOL = 1e-6  # what bilm-tf's and AllenNLP's own tests ask of this fixture
PROG = "python -m elmo_tf dump-token-embeddings"


def temporaries(directory):
    return sorted(p.name for p in Path(directory).iterdir() if ".tmp-" in p.name)


@pytest.fixture(scope="module")
def allennlp_elmo():
    if not ALLENNLP.is_dir():
        pytest.skip(f"fixture data not found at {ALLENNLP}")
    return load_elmo(OPTIONS, WEIGHTS)


@pytest.fixture(scope="module")
def fixture_table():
    if not ALLENNLP.is_dir():
        pytest.skip(f"fixture data not found at {ALLENNLP}")
    with h5py.File(CACHE, "r") as f:
        return f["embedding"][...]


@pytest.fixture(scope="module")
def fixture_vocab():
    if not ALLENNLP.is_dir():
        pytest.skip(f"fixture data not found at {ALLENNLP}")
    return read_vocabulary(VOCAB)


# ---------------------------------------------------------------- compute: parity with the recorded fixture


def test_fixture_vocabulary_reads_as_the_originals_read_it(fixture_vocab):
    with open(VOCAB, encoding="utf-8") as f:
        original = f.read().strip().split("\n")  # bilm-tf / AllenNLP
    assert fixture_vocab == [w.encode("utf-8") for w in original]
    assert len(fixture_vocab) == 458 and {b"<S>", b"</S>", b"<UNK>"} <= set(fixture_vocab)


def test_compute_reproduces_the_allennlp_fixture_row_by_row(allennlp_elmo, fixture_vocab, fixture_table):
    got = compute_token_embeddings(allennlp_elmo, fixture_vocab)
    assert got.dtype == np.float32 and got.shape == fixture_table.shape == (458, 16)
    diff = np.abs(got - fixture_table).max(axis=1)
    assert np.all(diff < ATOL), f"rows {np.flatnonzero(diff >= ATOL)[:10]} differ by up to {diff.max():.3g}"
    # the boundary tokens are the model's own <S> / </S> vectors, not those of the words "<S>" / "</S>"
    bounds = allennlp_elmo.char_cnn(np.stack([BOS_CHAR_IDS, EOS_CHAR_IDS])[:, None]).numpy()[:, 0]
    np.testing.assert_allclose(got[[fixture_vocab.index(b"<S>"), fixture_vocab.index(b"</S>")]], bounds, atol=ATOL)


def test_batch_sizes_give_the_same_array(allennlp_elmo, fixture_vocab, fixture_table):
    """Batch sizes agree to float32 rounding, not bit for bit: the CPU kernels sum in another order for another
    number of rows. Bound: 4 units in the last place at the table's largest magnitude (|x| up to 7.06 here, 1 ulp
    4.8e-7), about 1.9e-6; batch_size 1 differs from 1024 by 1.4e-6 on this machine, 7 by 7e-7."""
    done = []
    by_size = {
        size: compute_token_embeddings(allennlp_elmo, fixture_vocab, batch_size=size, progress=done.append)
        for size in (1, 7, 1024)
    }
    assert done == [1] * 458 + [7] * 65 + [3] + [458]  # progress: the tokens of each batch, every token once
    reference = by_size[1024]
    bound = max(ATOL, 4 * float(np.spacing(np.abs(reference).max())))
    assert bound < 2e-6
    for size, array in by_size.items():
        assert array.shape == (458, 16)
        diff = np.abs(array - reference).max()
        assert diff <= bound, f"batch_size {size}: max |diff| {diff:.3g} > {bound:.3g}"
        assert np.abs(array - fixture_table).max() <= bound, size


def test_compute_edge_cases(allennlp_elmo):
    assert compute_token_embeddings(allennlp_elmo, []).shape == (0, 16)
    as_str = compute_token_embeddings(allennlp_elmo, ["naïve", "<S>", "", "x" * 60])
    as_bytes = compute_token_embeddings(allennlp_elmo, ["naïve".encode(), b"<S>", b"", b"x" * 60])
    np.testing.assert_array_equal(as_str, as_bytes)
    assert not as_str[2].any() and as_str[0].any()  # "" is padding: a zero row
    cut = compute_token_embeddings(allennlp_elmo, ["x" * 48, "x" * 60])  # tokens are cut to 48 bytes
    np.testing.assert_allclose(cut[0], cut[1], atol=ATOL)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match=f"batch_size must be a positive int, got {bad!r}"):
            compute_token_embeddings(allennlp_elmo, ["a"], batch_size=bad)
    with pytest.raises(TypeError, match="sequence of tokens"):
        compute_token_embeddings(allennlp_elmo, "abc")


# ---------------------------------------------------------------- written file


def test_written_file_has_exactly_the_fixture_layout_and_round_trips(tmp_path, fixture_vocab, fixture_table):
    table = fixture_table + np.float32(0.25)  # not the fixture itself: the values written must be these
    path = tmp_path / "cache.hdf5"
    write_token_embeddings(path, table, vocabulary=fixture_vocab)
    with h5py.File(path, "r") as f, h5py.File(CACHE, "r") as g:
        assert set(f) == set(g) == {"embedding"}
        assert f["embedding"].dtype == g["embedding"].dtype == np.float32
        assert f["embedding"].shape == (458, 16)
        np.testing.assert_array_equal(f["embedding"][...], table)  # exact
        assert int(f.attrs[SIZE_ATTR]) == 458
        assert f.attrs[DIGEST_ATTR] == hashlib.sha256(b"\n".join(fixture_vocab)).hexdigest()
        assert f.attrs[DIGEST_ATTR] == hashlib.sha256(VOCAB.read_bytes()).hexdigest()  # no final newline there
    np.testing.assert_array_equal(load_token_embeddings(path, fixture_vocab, projection_dim=16), table)
    np.testing.assert_array_equal(load_token_embeddings(path, VOCAB), table)
    assert temporaries(tmp_path) == []


def test_write_takes_any_real_array_and_refuses_bad_ones(tmp_path):
    path = tmp_path / "c.hdf5"
    write_token_embeddings(path, np.arange(6, dtype=np.float64).reshape(3, 2))  # no vocabulary: no attributes
    with h5py.File(path, "r") as f:
        assert f["embedding"].dtype == np.float32 and dict(f.attrs) == {}
        np.testing.assert_array_equal(f["embedding"][...], [[0, 1], [2, 3], [4, 5]])
    for bad, needle in [
        (np.zeros(3), "2-D"),
        (np.array([[1.0, np.nan]]), "NaN or inf"),
        (np.array([["a", "b"]]), "real numbers"),
    ]:
        with pytest.raises(ValueError, match=needle):
            write_token_embeddings(path, bad)
    with pytest.raises(ValueError, match="3 rows but the vocabulary has 2 tokens"):
        write_token_embeddings(path, np.zeros((3, 2)), vocabulary=[b"a", b"b"])
    with h5py.File(path, "r") as f:  # never touched by the refused writes
        np.testing.assert_array_equal(f["embedding"][...], [[0, 1], [2, 3], [4, 5]])


def test_an_interrupted_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "c.hdf5"
    write_token_embeddings(path, np.ones((2, 3)), vocabulary=["a", "b"])
    before = path.read_bytes()

    def interrupted(tokens):
        raise KeyboardInterrupt

    import elmo_tf.io.token_embeddings as module

    monkeypatch.setattr(module, "vocabulary_digest", interrupted)  # after the dataset is written, before the end
    with pytest.raises(KeyboardInterrupt):
        write_token_embeddings(path, np.zeros((2, 3)), vocabulary=["a", "b"])
    assert path.read_bytes() == before
    assert temporaries(tmp_path) == []


def test_dump_token_embeddings(allennlp_elmo, tmp_path, fixture_table):
    out = tmp_path / "dump.hdf5"
    assert dump_token_embeddings(allennlp_elmo, VOCAB, out, batch_size=100) == 458
    np.testing.assert_allclose(load_token_embeddings(out, VOCAB, projection_dim=16), fixture_table, atol=ATOL, rtol=0)


# ---------------------------------------------------------------- read_vocabulary


@pytest.mark.parametrize(
    "data",
    [
        b"the\ncat\n<S>",
        b"the\ncat\n<S>\n",
        b"the\r\ncat\r\n<S>\r\n",
        b"the\r\ncat\r\n<S>",
        codecs.BOM_UTF8 + b"the\ncat\n<S>\n",
    ],
    ids=["no-final-newline", "final-newline", "crlf", "crlf-no-final", "bom"],
)
def test_read_vocabulary_accepts_the_usual_line_ends(tmp_path, data):
    path = tmp_path / "vocab.txt"
    path.write_bytes(data)
    assert read_vocabulary(path) == [b"the", b"cat", b"<S>"]


def test_read_vocabulary_keeps_invalid_utf8_as_bytes(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_bytes(b"caf\xe9\nna\xc3\xafve\n\xff\xfe\x80\n")
    assert read_vocabulary(path) == [b"caf\xe9", "naïve".encode(), b"\xff\xfe\x80"]


@pytest.mark.parametrize(
    "data,line,needle",
    [
        (b"the\n\ncat\n", 2, "empty line"),
        (b"the\ncat\n\n", 3, "empty line"),  # a blank line at the end too: row j must be line j + 1
        (b"the\nbig cat\n", 2, "holds whitespace (byte 0x20 at position 3)"),
        (b"the\ncat\t\n", 2, "holds whitespace (byte 0x09"),
        (b"the\n cat\n", 2, "holds whitespace (byte 0x20 at position 0)"),
        (b"the\ncat\r\n\x0bdog\n", 3, "holds whitespace (byte 0x0b"),
        (b"the\ncat\nsat\ncat\n", 4, "duplicate token 'cat', already on line 2"),
        (b"the\n<S>\n<S>\n", 3, "duplicate token '<S>', already on line 2"),
        ("the\ncat\n".encode("utf-16"), 1, "UTF-16/UTF-32 byte order mark"),
        (b"t\x00h\x00e\x00\n\x00", 1, "NUL byte"),
        (codecs.BOM_UTF8, 1, "empty line"),
    ],
    ids=[
        "empty-inside",
        "empty-at-end",
        "space",
        "tab",
        "leading-space",
        "vertical-tab",
        "duplicate",
        "duplicate-boundary",
        "utf16",
        "utf16-without-bom",
        "bom-only",
    ],
)
def test_read_vocabulary_refusals_name_the_file_and_line(tmp_path, data, line, needle):
    path = tmp_path / "vocab.txt"
    path.write_bytes(data)
    with pytest.raises(TokenEmbeddingError) as info:
        read_vocabulary(path)
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: "), message
    assert needle in message, message


def test_read_vocabulary_refuses_an_empty_or_missing_file(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_bytes(b"")
    with pytest.raises(TokenEmbeddingError, match=f"^{re.escape(str(path))}: the file is empty"):
        read_vocabulary(path)
    with pytest.raises(TokenEmbeddingError, match="missing.txt: No such file"):
        read_vocabulary(tmp_path / "missing.txt")
    with pytest.raises(TokenEmbeddingError, match="is a directory"):
        read_vocabulary(tmp_path)


def test_vocabulary_digest_is_that_of_the_tokens_joined_by_newlines():
    assert vocabulary_digest(["a", b"b\xff"]) == hashlib.sha256(b"a\nb\xff").hexdigest()
    assert vocabulary_digest(["a", "b"]) != vocabulary_digest(["b", "a"])


# ---------------------------------------------------------------- load_token_embeddings


def test_the_fixture_file_without_attributes_loads(fixture_vocab, fixture_table):
    with h5py.File(CACHE, "r") as f:
        assert dict(f.attrs) == {}
    got = load_token_embeddings(CACHE, VOCAB, projection_dim=16)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, fixture_table)
    np.testing.assert_array_equal(load_token_embeddings(CACHE, [t.decode() for t in fixture_vocab]), fixture_table)


def write_raw(path, attrs=None, **datasets):
    with h5py.File(path, "w") as f:
        for name, data in datasets.items():
            f.create_dataset(name, data=data)
        f.attrs.update(attrs or {})


VOCAB3 = [b"a", b"b", b"c"]


@pytest.mark.parametrize(
    "datasets,projection_dim,needle",
    [
        ({"embedding": np.zeros((2, 4), np.float32)}, None, "has 2 rows but the vocabulary given has 3 tokens"),
        ({"embedding": np.zeros((3, 5), np.float32)}, 4, "has width 5, but the model's projection_dim is 4"),
        ({"embedding": np.array([[0, 1], [np.nan, 0], [0, 0]], np.float32)}, None, "NaN or inf"),
        ({"embedding": np.array([[0, 1], [np.inf, 0], [0, 0]], np.float64)}, None, "NaN or inf"),
        ({"weights": np.zeros((3, 4), np.float32)}, None, "has no dataset 'embedding'"),
        ({"embedding": np.array([[b"x"], [b"y"], [b"z"]])}, None, "holds strings"),
        ({"embedding": np.zeros((3, 4), np.int32)}, None, "holds dtype int32, expected floating point"),
        ({"embedding": np.zeros(3, np.float32)}, None, "has shape (3,), expected 2-D"),
        ({"embedding/inner": np.zeros((3, 4), np.float32)}, None, "'embedding' is a Group, not a dataset"),
    ],
    ids=["rows", "width", "nan", "inf", "missing", "strings", "integers", "1-D", "group"],
)
def test_load_refuses_bad_files_naming_the_file(tmp_path, datasets, projection_dim, needle):
    path = tmp_path / "bad.hdf5"
    write_raw(path, **datasets)
    with pytest.raises(TokenEmbeddingError) as info:
        load_token_embeddings(path, VOCAB3, projection_dim=projection_dim)
    assert str(info.value).startswith(f"{path}: "), str(info.value)
    assert needle in str(info.value), str(info.value)


def test_load_refuses_a_cache_written_for_another_vocabulary(tmp_path):
    path = tmp_path / "cache.hdf5"
    write_token_embeddings(path, np.ones((3, 4)), vocabulary=VOCAB3)
    np.testing.assert_array_equal(load_token_embeddings(path, ["a", "b", "c"]), np.ones((3, 4)))
    other = tmp_path / "other.txt"
    other.write_bytes(b"a\nc\nb\n")  # same size, other order: every row would be wrong
    with pytest.raises(TokenEmbeddingError) as info:
        load_token_embeddings(path, other)
    message = str(info.value)
    assert message.startswith(f"{path}: was written for another vocabulary"), message
    assert f"3 tokens, sha256 {vocabulary_digest(VOCAB3)[:16]}" in message
    assert f"the vocabulary {other} (3 tokens, sha256 {vocabulary_digest([b'a', b'c', b'b'])[:16]}" in message
    with pytest.raises(TokenEmbeddingError, match=r"another vocabulary \(3 tokens.*the vocabulary given \(4 tokens"):
        load_token_embeddings(path, VOCAB3 + [b"d"])


def test_load_refuses_missing_and_non_hdf5_files(tmp_path):
    with pytest.raises(TokenEmbeddingError, match="no such token embedding file"):
        load_token_embeddings(tmp_path / "missing.hdf5", VOCAB3)
    junk = tmp_path / "junk.hdf5"
    junk.write_bytes(b"not hdf5 at all")
    with pytest.raises(TokenEmbeddingError, match=f"^{re.escape(str(junk))}: cannot read the token embedding file"):
        load_token_embeddings(junk, VOCAB3)
    good = tmp_path / "good.hdf5"
    write_token_embeddings(good, np.ones((200, 64)), vocabulary=[str(k) for k in range(200)])
    truncated = tmp_path / "truncated.hdf5"
    truncated.write_bytes(good.read_bytes()[: os.path.getsize(good) // 2])
    with pytest.raises(TokenEmbeddingError, match=f"^{re.escape(str(truncated))}: "):
        load_token_embeddings(truncated, [str(k) for k in range(200)])


# ---------------------------------------------------------------- CLI


def cli(capsys, *args):
    """`python -m elmo_tf dump-token-embeddings ...` in this process: (exit status, stderr lines with "error:")."""
    try:
        code = main(["dump-token-embeddings", *map(str, args)], prog="python -m elmo_tf")
    except SystemExit as e:  # argparse's own errors
        code = e.code
    err = capsys.readouterr().err
    return code, [line for line in err.splitlines() if "error:" in line], err


def test_cli_writes_the_fixture_file(capsys, tmp_path, fixture_table, caplog):
    out = tmp_path / "out.hdf5"
    args = ["--options", OPTIONS, "--weights", WEIGHTS, "--vocab", VOCAB, "--output", out, "--batch-size", 100]
    with caplog.at_level("INFO", logger="elmo_tf"):
        code, errors, err = cli(capsys, *args)
    assert code == 0 and errors == [], err
    with h5py.File(out, "r") as f:
        assert set(f) == {"embedding"} and f["embedding"].dtype == np.float32
        got = f["embedding"][...]
    assert got.shape == (458, 16)
    assert np.abs(got - fixture_table).max() < ATOL
    logged = [r.getMessage() for r in caplog.records if r.name == "elmo_tf"]
    assert len(logged) == 1 and logged[0].startswith("458 tokens in "), logged
    assert logged[0].endswith(f" s; wrote {out} (458 x 16)"), logged
    assert temporaries(tmp_path) == []


@needs_fixtures
def test_cli_refuses_to_overwrite_the_vocabulary(capsys, tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_bytes(b"the\ncat\n")
    link = tmp_path / "link.hdf5"
    link.symlink_to(vocab)
    for output in (vocab, link):
        code, errors, err = cli(
            capsys, "--options", OPTIONS, "--weights", WEIGHTS, "--vocab", vocab, "--output", output
        )
        assert code == 2, err
        assert len(errors) == 1 and errors[0].startswith(f"{PROG}: error: --output: "), err
        assert "same file as --vocab" in errors[0]
        assert vocab.read_bytes() == b"the\ncat\n"
    code, errors, _ = cli(capsys, "--options", OPTIONS, "--weights", WEIGHTS, "--vocab", VOCAB, "--output", OPTIONS)
    assert code == 2 and "same file as --options" in errors[0]
    out = tmp_path / "o.hdf5"
    code, errors, _ = cli(
        capsys, "--options", OPTIONS, "--weights", WEIGHTS, "--vocab", vocab, "--output", out, "--batch-size", 0
    )
    assert code == 2 and "--batch-size must be >= 1, got '0'" in errors[0] and not out.exists()
    assert temporaries(tmp_path) == []


@needs_fixtures
@pytest.mark.parametrize(
    "vocab,flag,needle",
    [
        (b"the\ncat\nthe\n", "--vocab", "vocab.txt:3: duplicate token 'the', already on line 1"),
        (b"the\n\ncat\n", "--vocab", "vocab.txt:2: empty line"),
        (b"the\ncat\n", "--weights", "has no dataset"),
    ],
    ids=["duplicate", "empty-line", "bad-weights"],
)
def test_cli_data_errors_exit_1_with_one_line(capsys, tmp_path, vocab, flag, needle):
    (tmp_path / "vocab.txt").write_bytes(vocab)
    weights = WEIGHTS
    if flag == "--weights":
        weights = tmp_path / "w.hdf5"
        write_raw(weights, embedding=np.zeros((2, 16), np.float32))
    out = tmp_path / "out.hdf5"
    code, errors, err = cli(
        capsys, "--options", OPTIONS, "--weights", weights, "--vocab", tmp_path / "vocab.txt", "--output", out
    )
    assert code == 1, err
    assert "Traceback" not in err
    assert len(errors) == 1 and errors[0].startswith(f"{PROG}: error: {flag}: "), err
    assert needle in errors[0], errors[0]
    assert not out.exists() and temporaries(tmp_path) == []


@needs_fixtures
def test_cli_bad_vocabulary_as_a_subprocess(tmp_path):
    (tmp_path / "vocab.txt").write_bytes(b"the\nbig cat\n")
    out = tmp_path / "out.hdf5"
    out.write_bytes(b"an older file")
    args = ["--options", OPTIONS, "--weights", WEIGHTS, "--vocab", tmp_path / "vocab.txt", "--output", out]
    result = run_command(["-m", "elmo_tf", "dump-token-embeddings", *args])
    assert_one_error(result, 1, f"{PROG}: error: --vocab: {tmp_path / 'vocab.txt'}:2: token 'big cat' holds whitespace")
    assert out.read_bytes() == b"an older file"
    assert temporaries(tmp_path) == []


# ---------------------------------------------------------------- converted models (elmo-tf convert)


def _converted(kind, tmp_path):
    from convert_testlib import converted_checkpoint, converted_efml

    if kind == "bilm-tf-checkpoint":
        return converted_checkpoint(tmp_path / "ckpt")
    return converted_efml(tmp_path / kind, kind.split(":")[1])


@pytest.mark.parametrize("kind", ["elmoformanylangs:word", "elmoformanylangs:noword", "bilm-tf-checkpoint"])
def test_cli_dump_then_embed_with_the_cache_equals_embed_without_it(capsys, tmp_path, kind):
    """`dump-token-embeddings` then `embed --token-embeddings` on a converted model: the same numbers as `embed`
    without the cache (1e-6), with the cache really used; the dumped rows are the model's own token layer for each
    word (its own char mapping: code points, 48-code-point cut, `<bos>`/`<eos>`, the word column)."""
    model_dir = _converted(kind, tmp_path)
    options, weights = model_dir / "options.json", model_dir / "weights.hdf5"
    words = ["The", "cat", "Café", "naïve", "Мама", "раму", ".", "<bos>", "<S>", "ж" * 60, "日本語"]
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(words) + "\n", encoding="utf-8")
    text = tmp_path / "in.txt"
    text.write_text("The cat Café naïve .\nМама мыла раму " + "ж" * 60 + " !\n日本語 unseen cat\n", encoding="utf-8")
    cache = tmp_path / "cache.hdf5"
    code, errors, err = cli(capsys, "--options", options, "--weights", weights, "--vocab", vocab, "--output", cache)
    assert code == 0 and errors == [], err
    elmo = load_elmo(options, weights)
    with h5py.File(cache, "r") as f:
        dumped = f["embedding"][...]
    for row, word in enumerate(words):
        if word in ("<bos>", "<S>"):
            continue  # a boundary token alone: its row is checked through the model's boundary ids below
        expected = elmo.embed_tokens(tf_tokens([[word]]))["word_emb"].numpy()[0, 0]
        np.testing.assert_allclose(dumped[row], expected, atol=1e-6, rtol=0, err_msg=word)
    boundary = "<bos>" if kind.startswith("elmoformanylangs") else "<S>"
    bos = elmo.char_cnn.encode_distinct(elmo.char_mapping.bos_row[None]).numpy()[0]
    np.testing.assert_allclose(dumped[words.index(boundary)], bos, atol=1e-6, rtol=0)
    outputs = {}
    for name, extra in (("plain", []), ("cached", ["--token-embeddings", cache, "--vocab", vocab])):
        out = tmp_path / f"{name}.hdf5"
        code = main(["embed", "--options", str(options), "--weights", str(weights), "--input", str(text),
                     "--output", str(out), *map(str, extra)], prog="python -m elmo_tf")  # fmt: skip
        assert code == 0, capsys.readouterr().err[-2000:]
        with h5py.File(out, "r") as f:
            outputs[name] = {key: f[key][...] for key in f if key != "sentence_to_index"}
    assert outputs["plain"].keys() == outputs["cached"].keys() == {"0", "1", "2"}
    for key, value in outputs["plain"].items():
        np.testing.assert_allclose(outputs["cached"][key], value, atol=1e-6, rtol=0, err_msg=key)
    # the model's in-graph table (`ELMo.use_token_embeddings`): cached words skip the char CNN, same numbers
    batch = tf_tokens([["The", "cat", "Café", "naïve", "."], ["日本語", "unseen", "cat", "", ""]])
    plain = [a.numpy() for a in elmo.embed_tokens(batch)["activations"]]
    elmo.use_token_embeddings(TokenCache.load(cache, vocab, projection_dim=elmo.config.projection_dim))
    assert elmo.token_ids(batch).numpy()[0].tolist() == [1, 2, 3, 4, 7]
    for layer, (a, b) in enumerate(zip(plain, elmo.embed_tokens(batch)["activations"])):
        np.testing.assert_allclose(b.numpy(), a, atol=1e-6, rtol=0, err_msg=f"layer {layer}")


def tf_tokens(token_lists):
    import tensorflow as tf

    return tf.constant([[t.encode("utf-8") for t in tokens] for tokens in token_lists], tf.string)
