"""elmo_tf/beam/pipeline.py (this name: tests/ner/test_pipeline.py holds the other): the Beam
pipeline on DirectRunner with 2 worker processes writes shards whose datasets
are `embed`'s (same names, values within 1e-6), each a valid embed output of its lines; merged, one file equal to
`embed`'s. The tiny random model of the other tests; an input with blank lines, non-ASCII and repeated lines."""

import json

import h5py
import numpy as np
import pytest
from cli_testlib import run_command

from elmo_tf.beam.pipeline import ReadIndexedLines, shard_of
from elmo_tf.embed import embed_file
from elmo_tf.io.embeddings_shards import open_shards, shard_path
from elmo_tf.io.sentences import iter_sentences, sentence_key, to_sentence
from elmo_tf.models import save_elmo

LINES = [
    "The cat sat on the mat .",
    "",
    "naïve 日本語 tokens",
    "   \t",
    "Hi",
    "a much longer sentence with many more tokens than any of the others here",
    "x  y",
    "Hi",
    "",
    "one two three four five",
    "  Hi ",
    "Ünïcödé ẞ ﬁ",
]
SHARDS = 3


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One pipeline run (CLI, 2 worker processes) and embed's output of the same file, shared by the tests."""
    import keras
    from tiny_models import TINY

    from elmo_tf.config import BiLMConfig
    from elmo_tf.models import ELMo

    keras.utils.set_random_seed(1234)
    tmp = tmp_path_factory.mktemp("beam")
    model = ELMo(BiLMConfig(**TINY))
    save_elmo(model, tmp / "model")
    text = tmp / "sentences.txt"
    text.write_bytes(("\ufeff" + "\r\n".join(LINES[:4]) + "\n" + "\n".join(LINES[4:]) + "\n").encode())
    embed_file(model, text, tmp / "embed.hdf5", batch_size=2)
    result = run_command(
        ["-m", "elmo_tf.beam", "--options", tmp / "model" / "options.json", "--weights", tmp / "model" / "weights.hdf5"]
        + ["--input", text, "--output", tmp / "out" / "emb", "--num-shards", SHARDS, "--batch-size", "2"]
        + ["--direct_num_workers", "2", "--direct_running_mode", "multi_processing"],
        timeout=600,
    )
    return tmp, text, result


def read(path):
    with h5py.File(path, "r") as f:
        arrays = {name: f[name][...] for name in f if name != "sentence_to_index"}
        return arrays, f["sentence_to_index"][0].decode()


def test_shards_hold_embeds_datasets_and_are_each_an_embed_output(run):
    tmp, text, result = run
    assert result.returncode == 0, result.stderr
    expected, _ = read(tmp / "embed.hdf5")
    lines = [s.line for s in iter_sentences(text)]
    seen = []
    for k in range(SHARDS):
        arrays, index = read(shard_path(str(tmp / "out" / "emb"), k, SHARDS))
        mine = [i for i in range(len(lines)) if i * SHARDS // len(lines) == k]
        assert sorted(arrays, key=int) == [str(i) for i in mine]  # named by the line index in the whole input
        keys = {}
        for i in mine:
            keys[sentence_key(lines[i])] = str(i)
        assert index == json.dumps(keys)  # the sentence_to_index embed writes for these lines
        for name, array in arrays.items():
            assert array.dtype == np.float32 and array.shape == expected[name].shape, name
            np.testing.assert_allclose(array, expected[name], atol=1e-6, rtol=0, err_msg=name)
        seen += mine
    assert seen == list(range(len(LINES)))
    assert expected["1"].shape[1] == 0 and expected["3"].shape[1] == 0  # blank lines: 0 tokens, as embed writes
    assert [p.name for p in (tmp / "out").iterdir() if p.name.startswith(".")] == []  # no temporary left


def test_merged_shards_equal_embeds_file(run):
    tmp, _text, result = run
    assert result.returncode == 0, result.stderr
    merged = run_command(["-m", "elmo_tf", "merge-shards", "--input", tmp / "out" / "emb", "--output", tmp / "m.hdf5"])
    assert merged.returncode == 0, merged.stderr
    arrays, index = read(tmp / "m.hdf5")
    expected, expected_index = read(tmp / "embed.hdf5")
    assert index == expected_index  # the same JSON string: keys in the same order, repeated lines -> the last
    assert set(arrays) == set(expected)
    for name in expected:
        np.testing.assert_allclose(arrays[name], expected[name], atol=1e-6, rtol=0, err_msg=name)
    with open_shards(str(tmp / "out" / "emb")) as view:
        assert len(view) == len(LINES)
        np.testing.assert_array_equal(view["11"], arrays["11"])


def test_lines_are_numbered_as_embed_numbers_them(tmp_path):
    """ReadIndexedLines + to_sentence give embed's Sentence for every line (BOM, CRLF, blank, invalid UTF-8)."""
    path = tmp_path / "t.txt"
    path.write_bytes(b"\xef\xbb\xbfa b\r\n\n \t\nc \xff d\n\nlast")
    got = [to_sentence(i, line, 2) for i, line in ReadIndexedLines().process(str(path))]
    assert got == list(iter_sentences(path, max_sentence_tokens=2))


def test_shards_are_contiguous_ranges_in_order():
    assert [shard_of(i, 10, 3) for i in range(10)] == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert [shard_of(i, 2, 4) for i in range(2)] == [0, 2]  # more shards than lines: empty shards between


def test_a_float16_shard_is_embeds_float16_output(run, tmp_path):
    """`--dtype float16`: the worker's writer (`write_shard`, in process here) gives what `embed --dtype float16` gives
    for the same lines: float16 datasets, each the float32 result rounded."""
    from elmo_tf.beam.pipeline import ShardedEmbedConfig, write_shard
    from elmo_tf.embed import Embedder
    from elmo_tf.models import load_elmo

    tmp, text, _ = run
    model = load_elmo(tmp / "model" / "options.json", tmp / "model" / "weights.hdf5")
    config = ShardedEmbedConfig(
        options="", weights="", input=str(text), output="", batch_size=2, dtype="float16", num_shards=1
    )
    sentences = list(iter_sentences(text))
    counts = write_shard(Embedder(model, "all"), iter(sentences), tmp_path / "s.hdf5", config)
    assert counts == {"sentences": len(LINES), "tokens": sum(len(s.tokens) for s in sentences)}
    embed_file(model, text, tmp_path / "e16.hdf5", batch_size=2, dtype="float16")
    arrays, index = read(tmp_path / "s.hdf5")
    expected, expected_index = read(tmp_path / "e16.hdf5")
    assert index == expected_index and set(arrays) == set(expected)
    float32, _ = read(tmp / "embed.hdf5")
    for name, array in arrays.items():
        assert array.dtype == np.float16 and expected[name].dtype == np.float16, name
        np.testing.assert_array_equal(array, expected[name], err_msg=name)
        np.testing.assert_array_equal(array, float32[name].astype(np.float16), err_msg=name)
