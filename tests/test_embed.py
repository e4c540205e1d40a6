"""elmo_tf/embed.py and `python -m elmo_tf embed`: batching plan, hdf5 output, CLI errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import tensorflow as tf

from elmo_tf.embed import Embedder, embed_file, iter_batches, pack_rows, plan_batches
from elmo_tf.io.sentences import iter_sentences
from elmo_tf.models import save_elmo
from elmo_tf.preprocessing import whitespace_tokenize

REPO_ROOT = Path(__file__).resolve().parents[1]
L, P = 2, 8  # tiny config: 2 LSTM layers, projection 8

LINES = [
    "The cat sat on the mat .",
    "",
    "Hi",
    "a much longer sentence with many more tokens than any of the others",
    "naïve 日本語 tokens",
    "   \t",
    "x  y",
    "Hi",
    "one two three four five",
]


# ---------------------------------------------------------------- packing plan


def check_plan(batches, lengths, batch_size, max_batch_tokens, row_length):
    flat = [i for batch in batches for row in batch for i in row]
    non_empty = [i for i, n in enumerate(lengths) if n > 0]
    assert sorted(flat) == non_empty  # every non-empty sentence exactly once, empty ones never
    for batch in batches:
        assert 1 <= len(batch) <= batch_size
        sizes = [sum(lengths[i] + 2 for i in row) for row in batch]
        if max_batch_tokens is not None and len(batch) > 1:
            assert len(batch) * max(sizes) <= max_batch_tokens
        for row, size in zip(batch, sizes):
            assert size <= row_length or len(row) == 1  # only a sentence longer than a row gets a longer row


@pytest.mark.parametrize("sort", [True, False], ids=["sorted", "file-order"])
@pytest.mark.parametrize(
    "batch_size,max_batch_tokens,row_length", [(1, None, 64), (7, None, 16), (64, None, 64), (7, 60, 32), (64, 200, 64)]
)
def test_plan_covers_every_sentence_once_within_limits(batch_size, max_batch_tokens, row_length, sort):
    lengths = [int(n) for n in np.random.default_rng(batch_size).integers(0, 40, size=300)]
    batches = plan_batches(lengths, batch_size, max_batch_tokens, sort, row_length=row_length)
    check_plan(batches, lengths, batch_size, max_batch_tokens, row_length)


@pytest.mark.parametrize("sort", [True, False], ids=["sorted", "file-order"])
def test_packed_rows_leave_little_padding_in_any_order(sort):
    """The point of packing: in file order too, almost every LSTM step of a batch is a real position."""
    lengths = [int(n) for n in np.random.default_rng(1).integers(1, 40, size=2000)]
    batches = plan_batches(lengths, batch_size=32, sort=sort, row_length=64)
    real = sum(n + 2 for n in lengths)
    padded = sum(len(b) * max(sum(lengths[i] + 2 for i in row) for row in b) for b in batches)
    assert real / padded > 0.95
    # sentences of one batch are padded to its longest without packing: far more waste
    plain = sum(32 * max(lengths[k : k + 32]) + 64 for k in range(0, 2000, 32))
    assert real / plain < 0.7


def test_pack_rows_best_fit():
    assert pack_rows([3, 3, 2, 5, 1], row_length=6) == [[3, 4], [0, 1], [2]]  # 5+1, 3+3, 2
    assert pack_rows([9, 2], row_length=4) == [[0], [1]]  # too long: a row of its own
    rows = pack_rows([int(n) for n in np.random.default_rng(0).integers(1, 20, size=500)], row_length=40)
    assert sorted(i for row in rows for i in row) == list(range(500))


def test_a_stream_is_planned_with_bounded_look_ahead():
    """iter_batches never holds more than about one window of sentences, and in file order it yields a batch as
    soon as one batch of positions has been read."""
    read = []

    def stream():
        for i, n in enumerate(np.random.default_rng(2).integers(1, 30, size=3000)):
            read.append(i)
            yield i, int(n)

    emitted = 0
    for batch in iter_batches(stream(), batch_size=8, sort=False, row_length=64):
        emitted += sum(len(row) for row in batch)
        assert len(read) - emitted < 8 * 64  # fewer pending sentences than one batch has positions
    assert emitted == 3000
    read.clear()
    emitted = 0
    for batch in iter_batches(stream(), batch_size=8, sort=True, window=100, row_length=64):
        emitted += sum(len(row) for row in batch)
        assert len(read) - emitted <= 100 + 8 * 64
    assert emitted == 3000


def test_plan_rejects_bad_arguments():
    with pytest.raises(ValueError, match="batch_size"):
        plan_batches([1, 2], batch_size=0)
    with pytest.raises(ValueError, match="max_batch_tokens"):
        plan_batches([1, 2], batch_size=2, max_batch_tokens=0)
    with pytest.raises(ValueError, match="row_length"):
        plan_batches([1, 2], batch_size=2, row_length=0)
    with pytest.raises(ValueError, match="lengths"):
        plan_batches([1, -2], batch_size=2)
    assert plan_batches([0, 0], batch_size=2) == []


# ---------------------------------------------------------------- reading


def test_sentences_match_the_in_graph_tokenizer(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes(b"a b\r\n\n  c\td  \ncaf\xe9 \xff\nlast")
    sentences = list(iter_sentences(path))
    lines = [s.line for s in sentences]
    tokens = [s.tokens for s in sentences]
    assert lines == [b"a b", b"", b"  c\td  ", b"caf\xe9 \xff", b"last"]
    assert tokens == [[b"a", b"b"], [], [b"c", b"d"], [b"caf\xe9", b"\xff"], [b"last"]]
    tf_tokens, tf_lengths = whitespace_tokenize(tf.constant(lines))
    assert [list(row[:n]) for row, n in zip(tf_tokens.numpy(), tf_lengths.numpy())] == tokens


# ---------------------------------------------------------------- embed_file


@pytest.fixture
def input_file(tmp_path):
    path = tmp_path / "sentences.txt"
    path.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return path


def read_output(path):
    with h5py.File(path, "r") as f:
        index = json.loads(f["sentence_to_index"][0])
        arrays = {key: f[key][...] for key in f if key != "sentence_to_index"}
    return arrays, index


def test_embed_file_layers_all_top_average(tiny_elmo, input_file, tmp_path, to_char_ids):
    outputs = {}
    for layers in ("all", "top", "average"):
        stats = embed_file(tiny_elmo, input_file, tmp_path / f"{layers}.hdf5", batch_size=3, layers=layers)
        assert {k: stats[k] for k in ("sentences", "tokens", "empty", "truncated")} == {
            "sentences": len(LINES),
            "tokens": sum(len(s.split()) for s in LINES),
            "empty": 2,
            "truncated": 0,
        }
        assert stats["tokens"] == stats["cached"] + sum(len(s.split()) for s in LINES) and stats["cached"] == 0
        assert stats["distinct"] < stats["tokens"]  # repeated tokens of a batch go through the char CNN once
        outputs[layers], index = read_output(tmp_path / f"{layers}.hdf5")
        assert sorted(outputs[layers], key=int) == [str(i) for i in range(len(LINES))]
        for key, i in index.items():  # AllenNLP's key: the line without its (ASCII) whitespace ends
            assert LINES[int(i)].strip(" \t") == key
        assert set(index) == {line.strip(" \t") for line in LINES}
    for i, line in enumerate(LINES):
        n = len(line.split())
        everything, top, average = outputs["all"][str(i)], outputs["top"][str(i)], outputs["average"][str(i)]
        assert everything.shape == (L + 1, n, 2 * P) and everything.dtype == np.float32
        assert top.shape == average.shape == (n, 2 * P)
        np.testing.assert_array_equal(top, everything[-1])
        np.testing.assert_allclose(average, everything.mean(axis=0), atol=1e-6, rtol=0)
        if n:
            alone = tiny_elmo(to_char_ids([line.split()]))["activations"]
            np.testing.assert_allclose(everything, np.stack([np.asarray(a)[0] for a in alone]), atol=1e-5, rtol=0)
            assert np.abs(everything).max() > 0
    assert outputs["all"]["1"].shape == (L + 1, 0, 2 * P) and outputs["all"]["5"].shape == (L + 1, 0, 2 * P)
    assert outputs["top"]["1"].shape == (0, 2 * P) and outputs["average"]["5"].shape == (0, 2 * P)


def test_results_do_not_depend_on_batching_or_order(tiny_elmo, input_file, tmp_path):
    settings = [
        dict(batch_size=1, sort=False),
        dict(batch_size=3, sort=True),
        dict(batch_size=64, sort=False),
        dict(batch_size=64, sort=True, max_batch_tokens=10),
    ]
    results = []
    for k, kwargs in enumerate(settings):
        progress = []
        embed_file(tiny_elmo, input_file, tmp_path / f"{k}.hdf5", progress=progress.append, **kwargs)
        assert sum(progress) == len(LINES)
        results.append(read_output(tmp_path / f"{k}.hdf5")[0])
    for other in results[1:]:
        assert set(other) == set(results[0])
        for key, array in results[0].items():
            np.testing.assert_allclose(other[key], array, atol=1e-5, rtol=0, err_msg=key)


def test_max_sentence_tokens_cuts_before_embedding(tiny_elmo, input_file, tmp_path, to_char_ids):
    stats = embed_file(tiny_elmo, input_file, tmp_path / "cut.hdf5", max_sentence_tokens=3)
    assert stats["truncated"] == 3
    arrays, _ = read_output(tmp_path / "cut.hdf5")
    assert arrays["3"].shape == (L + 1, 3, 2 * P) and arrays["2"].shape == (L + 1, 1, 2 * P)
    alone = tiny_elmo(to_char_ids([LINES[3].split()[:3]]))["activations"]
    np.testing.assert_allclose(arrays["3"], np.stack([np.asarray(a)[0] for a in alone]), atol=1e-5, rtol=0)


def test_embed_file_rejects_unknown_layers(tiny_elmo, input_file, tmp_path):
    with pytest.raises(ValueError, match="layers"):
        embed_file(tiny_elmo, input_file, tmp_path / "x.hdf5", layers="middle")
    assert not (tmp_path / "x.hdf5").exists()


# ---------------------------------------------------------------- CLI


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "elmo_tf", "embed", *map(str, args)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )


def error_lines(stderr):
    return [line for line in stderr.splitlines() if "error:" in line]


@pytest.fixture
def saved_model(tiny_elmo, tmp_path):
    save_elmo(tiny_elmo, tmp_path / "model")
    return tmp_path / "model"


def test_cli_writes_the_file(saved_model, tiny_elmo, input_file, tmp_path):
    out = tmp_path / "cli.hdf5"
    result = run_cli(
        "--options",
        saved_model / "options.json",
        "--weights",
        saved_model / "weights.hdf5",
        "--input",
        input_file,
        "--output",
        out,
        "--layers",
        "top",
        "--batch-size",
        "2",
    )
    assert result.returncode == 0, result.stderr
    arrays, index = read_output(out)
    embed_file(tiny_elmo, input_file, tmp_path / "lib.hdf5", layers="top")
    expected, expected_index = read_output(tmp_path / "lib.hdf5")
    assert index == expected_index and set(arrays) == set(expected)
    for key in expected:
        np.testing.assert_allclose(arrays[key], expected[key], atol=1e-5, rtol=0, err_msg=key)


def test_cli_missing_weights_file(saved_model, input_file, tmp_path):
    out = tmp_path / "never.hdf5"
    result = run_cli(
        "--options",
        saved_model / "options.json",
        "--weights",
        tmp_path / "nope.hdf5",
        "--input",
        input_file,
        "--output",
        out,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and "--weights" in lines[0] and "nope.hdf5" in lines[0], result.stderr
    assert not out.exists()


def test_cli_batch_size_zero(saved_model, input_file, tmp_path):
    out = tmp_path / "never.hdf5"
    result = run_cli(
        "--options",
        saved_model / "options.json",
        "--weights",
        saved_model / "weights.hdf5",
        "--input",
        input_file,
        "--output",
        out,
        "--batch-size",
        "0",
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and "--batch-size" in lines[0], result.stderr
    assert not out.exists()


def test_a_killed_runs_temporary_is_removed_by_the_next_run(tiny_elmo, input_file, tmp_path):
    """A run killed with SIGKILL leaves `.<output>.tmp-<pid>-<random>`; the next embed into that directory removes
    it (its process is gone); a live process's temporary is left alone."""
    output = tmp_path / "out.hdf5"
    stale = tmp_path / ".out.hdf5.tmp-999999999-0123abcd"
    live = tmp_path / f".out.hdf5.tmp-{os.getppid()}-0123abcd"
    stale.write_bytes(b"half an hdf5 file")
    live.write_bytes(b"another run, still going")
    embed_file(tiny_elmo, input_file, output)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == [live.name]
    assert output.is_file()


def test_packing_memo_and_dedup_change_no_output(tiny_elmo, to_char_ids):
    """Rows packed with other sentences, token vectors shared within a batch (dedup) and across batches (memo):
    every sentence still gets the vectors it gets alone, and the memo really serves later batches."""
    rng = np.random.default_rng(0)
    words = [w.encode() for w in "the a of cat dog <S> </S> İSTANBUL x y z , . big small red".split()] + [b"caf\xe9"]
    sentences = [[words[k] for k in rng.integers(0, len(words), rng.integers(1, 25))] for _ in range(30)]
    plain = Embedder(tiny_elmo, "all", memo_size=0, row_length=16)
    memo = Embedder(tiny_elmo, "all", memo_size=8, row_length=40)
    first = plain.embed_batch(sentences)
    second = memo.embed_batch(sentences[:15]) + memo.embed_batch(sentences[15:])
    assert plain.stats["memo"] == 0 and memo.stats["memo"] > 0
    assert plain.stats["distinct"] < plain.stats["tokens"]
    for s, a, b in zip(sentences, first, second):
        alone = np.stack([np.asarray(x)[0] for x in tiny_elmo(to_char_ids([s]))["activations"]])
        np.testing.assert_allclose(a, alone, atol=1e-6, rtol=0)
        np.testing.assert_allclose(b, alone, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="memo_size"):
        Embedder(tiny_elmo, memo_size=-1)


# ---------------------------------------------------------------- float16 outputs

FIXTURES = REPO_ROOT.parent / "shared" / "data" / "elmo_fixtures" / "allennlp"
HALF_ULP = 2.0**-11  # float16 keeps 11 significant bits: rounding to the nearest is off by at most half an ulp
SUBNORMAL_STEP = 2.0**-24  # below 2**-14 float16 is subnormal: absolute steps of 2**-24, off by half that at most


def check_float16(path16, path32, stated_max_abs):
    """Every float16 dataset is its float32 twin rounded to the nearest float16; returns (max abs, mean abs, max rel
    over |x| >= 1e-3) of the error, and checks the max against `stated_max_abs` (the README's number)."""
    half, _ = read_output(path16)
    single, _ = read_output(path32)
    assert set(half) == set(single)
    errors, relative = [], []
    for key, exact in single.items():
        assert half[key].dtype == np.float16 and half[key].shape == exact.shape
        np.testing.assert_array_equal(half[key], exact.astype(np.float16), err_msg=key)
        error = np.abs(half[key].astype(np.float32) - exact)
        assert (error <= np.maximum(np.abs(exact) * HALF_ULP, SUBNORMAL_STEP / 2)).all(), key
        errors.append(error.ravel())
        big = np.abs(exact) >= 1e-3
        relative.append((error[big] / np.abs(exact[big])).ravel())
    errors, relative = np.concatenate(errors), np.concatenate(relative)
    assert errors.max() <= stated_max_abs and relative.max() <= HALF_ULP
    return errors.max(), errors.mean(), relative.max()


def test_float16_output_is_the_float32_output_rounded(tiny_elmo, input_file, tmp_path):
    for dtype in ("float32", "float16"):
        embed_file(tiny_elmo, input_file, tmp_path / f"{dtype}.hdf5", batch_size=3, dtype=dtype)
    check_float16(tmp_path / "float16.hdf5", tmp_path / "float32.hdf5", stated_max_abs=2e-3)


@pytest.mark.skipif(not FIXTURES.is_dir(), reason=f"fixture data not found at {FIXTURES}")
def test_float16_error_with_the_fixture_weights(tmp_path):
    from elmo_tf import load_elmo

    elmo = load_elmo(FIXTURES / "options.json", FIXTURES / "lm_weights.hdf5")
    with open(FIXTURES / "sentences.json") as f:
        lines = [s for batch in json.load(f) for s in batch]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for dtype in ("float32", "float16"):
        embed_file(elmo, tmp_path / "in.txt", tmp_path / f"{dtype}.hdf5", batch_size=4, dtype=dtype)
    check_float16(tmp_path / "float16.hdf5", tmp_path / "float32.hdf5", stated_max_abs=2e-3)


def test_a_value_float16_cannot_hold_is_refused():
    from elmo_tf.embed import cast_embedding, check_dtype
    from elmo_tf.errors import ElmoTFError

    assert cast_embedding(np.array([65504.0, -1e-9], np.float32), "float16").dtype == np.float16
    with pytest.raises(ElmoTFError, match=r"magnitude 70000 \(line index 7\) does not fit float16"):
        cast_embedding(np.array([1.0, -7e4], np.float32), "float16", index=7)
    assert check_dtype(np.float16) == "float16"
    with pytest.raises(ElmoTFError, match="dtype must be one of"):
        check_dtype("bfloat16")


# ---------------------------------------------------------------- interrupted, then resumed (in this process)


class Interrupt(KeyboardInterrupt):
    pass


def interrupt_after(batches):
    calls = []

    def progress(n):
        calls.append(n)
        if len(calls) == batches:
            raise Interrupt

    return progress


def long_input(tmp_path, n=400, seed=0):
    rng = np.random.default_rng(seed)
    words = "the cat sat on a mat and ran far away naïve café , .".split()
    lines = [" ".join(rng.choice(words, size=rng.integers(0, 30))) for _ in range(n)]
    path = tmp_path / "long.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("sort", [True, False], ids=["sorted", "file-order"])
def test_an_interrupted_run_resumes_to_the_same_file(tiny_elmo, tmp_path, sort):
    from elmo_tf.io.journal import state_dir_of

    source = long_input(tmp_path)
    settings = dict(batch_size=4, sort=sort, shard_tokens=300)
    whole = embed_file(tiny_elmo, source, tmp_path / "whole.hdf5", **settings)
    assert whole["shards"] >= 8 and whole["resumed_shards"] == 0
    output = tmp_path / "out.hdf5"
    with pytest.raises(Interrupt):
        embed_file(tiny_elmo, source, output, progress=interrupt_after(15), **settings)
    kept = sorted(os.listdir(state_dir_of(output)))
    assert not output.exists() and "manifest.json" in kept and len(kept) >= 3  # a few shards, no temporary
    progress, starts = [], []
    stats = embed_file(
        tiny_elmo,
        source,
        output,
        resume=True,
        progress=progress.append,
        on_start=lambda *a: starts.append(a),
        **settings,
    )
    assert stats["resumed_shards"] == len(kept) - 1 and stats["shards"] == whole["shards"]
    assert starts == [(400, stats["resumed_sentences"])] and sum(progress) == 400 - stats["resumed_sentences"]
    assert stats["computed_tokens"] < whole["computed_tokens"] == whole["tokens"] == stats["tokens"]
    with h5py.File(output, "r") as a, h5py.File(tmp_path / "whole.hdf5", "r") as b:
        assert set(a) == set(b) and a["sentence_to_index"][0] == b["sentence_to_index"][0]
        for key in b:
            assert a[key].dtype == b[key].dtype and np.array_equal(a[key][...], b[key][...]), key
    assert not os.path.exists(state_dir_of(output))


def test_a_resume_with_other_settings_is_refused(tiny_elmo, tmp_path):
    from elmo_tf.io.journal import ResumeRefused

    source = long_input(tmp_path)
    output = tmp_path / "out.hdf5"
    with pytest.raises(Interrupt):
        embed_file(tiny_elmo, source, output, batch_size=4, shard_tokens=300, progress=interrupt_after(10))
    with pytest.raises(ResumeRefused) as caught:
        embed_file(tiny_elmo, source, output, batch_size=5, shard_tokens=300, layers="top", resume=True)
    assert [d[0] for d in caught.value.differences] == ["layers", "batch_size", "max_batch_tokens"]
    assert ("layers", '"all"', '"top"') in caught.value.differences
    other = changed_copy(tiny_elmo)
    with pytest.raises(ResumeRefused) as caught:
        embed_file(other, source, output, batch_size=4, shard_tokens=300, resume=True)
    assert [d[0] for d in caught.value.differences] == ["model"]


def changed_copy(model):
    """A model of the same shape as `model` with one weight changed."""
    from elmo_tf.models import ELMo

    other = ELMo(model.config)
    other.set_weights(model.get_weights())
    weight = other.weights[3]
    weight.assign(weight.numpy() + 1e-3)
    return other


def test_pieces_of_an_input_embedded_apart_merge_into_the_whole_file(tiny_elmo, tmp_path):
    """What a distributed job does with the library: each worker embeds its share of the lines (keeping their global
    indices) into a valid embed output of its own (`embed_sentences` + `write_embedding_file`); `merge_shards` joins
    them into the file `embed_file` writes (the same datasets within float rounding, the same sentence_to_index
    mapping, duplicates and empty lines included)."""
    from elmo_tf.embed import Embedder, embed_sentences, merge_shards, write_embedding_file

    source = long_input(tmp_path, n=120, seed=3)
    with open(source, "a", encoding="utf-8") as f:
        f.write("the cat sat\n\nthe cat sat\n")  # a repeated line: its key maps to the last one
    embed_file(tiny_elmo, source, tmp_path / "whole.hdf5", dtype="float16")
    sentences = list(iter_sentences(source))
    embedder = Embedder(tiny_elmo)
    shards = []
    for k, share in enumerate((sentences[0::2], sentences[1::2])):  # two workers, interleaved lines
        shards.append(tmp_path / f"piece-{k}.hdf5")
        written = write_embedding_file(shards[-1], embed_sentences(embedder, share, batch_size=3), dtype="float16")
        assert written == len(share)
        arrays, index = read_output(shards[-1])  # each piece is an embed output of its lines
        assert sorted(arrays, key=int) == [str(s.index) for s in share]
        assert set(index.values()) <= {str(s.index) for s in share}
    assert merge_shards(shards, tmp_path / "merged.hdf5", dtype="float16") == len(sentences)
    merged, merged_index = read_output(tmp_path / "merged.hdf5")
    whole, whole_index = read_output(tmp_path / "whole.hdf5")
    assert merged_index == whole_index and merged_index["the cat sat"] == str(len(sentences) - 1)
    assert set(merged) == set(whole)
    for key, array in whole.items():
        assert merged[key].dtype == np.float16
        np.testing.assert_allclose(merged[key].astype(np.float32), array.astype(np.float32), atol=2e-3, rtol=0)


def test_an_input_that_changes_while_it_is_read_is_an_error_not_a_mixed_output(tiny_elmo, input_file, tmp_path):
    """The input is hashed first (the journal's fingerprint) and read again to embed: lines appended in between
    (a corpus still being written) used to end up in an output whose journal vouched for the old content."""
    from elmo_tf.io.text import TextFileError

    changed = []

    def append_once(_):
        if not changed:
            with open(input_file, "a", encoding="utf-8") as f:
                f.write("a line written while embed reads\n")
            changed.append(True)

    out = tmp_path / "out.hdf5"
    with pytest.raises(TextFileError, match=r"changed while it was read"):
        embed_file(tiny_elmo, input_file, out, batch_size=1, progress=append_once, shard_tokens=1)
    assert not out.exists()
