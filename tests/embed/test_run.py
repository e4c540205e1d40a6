"""elmo_tf/embed/run.py: `embed_file` (the layers, outputs independent of batching, cut sentences, temporaries of killed
runs, an interrupted run resumed in this process, a resume refused, an input changing while read) and the lines it
reads."""

import os

import h5py
import numpy as np
import pytest
import tensorflow as tf
from embed_testlib import LINES, L, P, long_input, read_output, write_lines

from elmo_tf.embed import embed_file
from elmo_tf.io.sentences import iter_sentences
from elmo_tf.preprocessing import whitespace_tokenize

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
    return write_lines(tmp_path)


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


def test_max_sentence_tokens_splits_a_long_line_into_pieces(tiny_elmo, input_file, tmp_path, to_char_ids):
    """A line of more than `max_sentence_tokens` tokens is split into consecutive pieces of that many, each embedded
    as a sentence of its own; its dataset holds every token, the pieces' vectors in order; the file says so (and what
    the vectors were computed in: `precision`)."""
    stats = embed_file(tiny_elmo, input_file, tmp_path / "split.hdf5", max_sentence_tokens=3, batch_size=2)
    assert stats["split"] == sum(len(line.split()) > 3 for line in LINES) == 3 and stats["truncated"] == 0
    arrays, _ = read_output(tmp_path / "split.hdf5")
    for i, line in enumerate(LINES):
        tokens = line.split()
        assert arrays[str(i)].shape == (L + 1, len(tokens), 2 * P)
        pieces = [tokens[k : k + 3] for k in range(0, len(tokens), 3)]
        if pieces:
            alone = [np.stack([np.asarray(a)[0] for a in tiny_elmo(to_char_ids([p]))["activations"]]) for p in pieces]
            np.testing.assert_allclose(arrays[str(i)], np.concatenate(alone, axis=1), atol=1e-5, rtol=0)
    with h5py.File(tmp_path / "split.hdf5", "r") as f:
        assert dict(f.attrs) == {"max_sentence_tokens": 3, "long_sentences": "split", "precision": "float32"}
    whole = embed_file(tiny_elmo, input_file, tmp_path / "whole.hdf5", max_sentence_tokens=None)
    assert whole["split"] == 0
    with h5py.File(tmp_path / "whole.hdf5", "r") as f:
        assert dict(f.attrs) == {"long_sentences": "whole", "precision": "float32"}
    np.testing.assert_allclose(read_output(tmp_path / "whole.hdf5")[0]["2"], arrays["2"], atol=1e-6)  # 1 token


def test_a_large_input_is_warned_of_its_sentence_index(tiny_elmo, input_file, tmp_path, monkeypatch, caplog):
    """From `INDEX_WARNING_BYTES` of input on, one warning names the input, its size and --no-sentence-index; none
    without the index or below the size."""
    import elmo_tf.embed.run as run

    size = os.path.getsize(input_file)
    for threshold, index, warned in ((size, True, True), (size + 1, True, False), (size, False, False)):
        monkeypatch.setattr(run, "INDEX_WARNING_BYTES", threshold)
        caplog.clear()
        with caplog.at_level("WARNING", logger="elmo_tf.embed.run"):
            embed_file(tiny_elmo, input_file, tmp_path / "out.hdf5", batch_size=3, sentence_index=index)
        messages = [r.getMessage() for r in caplog.records if r.name == "elmo_tf.embed.run"]
        assert len(messages) == warned, messages
        if warned:
            assert str(input_file) in messages[0] and "--no-sentence-index" in messages[0], messages[0]
            assert f"{size / 1e9:.2f} GB" in messages[0]


def test_embed_file_rejects_unknown_layers(tiny_elmo, input_file, tmp_path):
    with pytest.raises(ValueError, match="layers"):
        embed_file(tiny_elmo, input_file, tmp_path / "x.hdf5", layers="middle")
    assert not (tmp_path / "x.hdf5").exists()


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
