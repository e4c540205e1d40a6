"""elmo_tf/beam/pipeline.py (this name: tests/ner/test_pipeline.py holds the other): the Beam
pipeline on DirectRunner with 2 worker processes writes shards whose datasets
are `embed`'s (same names, values within 1e-6), each a valid embed output of its lines; merged, one file equal to
`embed`'s. The tiny random model of the other tests; an input with blank lines, non-ASCII and repeated lines, and a
line longer than --max-sentence-tokens (split as embed splits it). Each shard carries its run's fingerprint and its
place; merge-shards refuses a shard of another run (written here by the workers' own code, `write_shard`) and an
incomplete or duplicated set, naming the file, the attribute and both values."""

import json
import shutil

import h5py
import numpy as np
import pytest
from cli_testlib import assert_one_error, run_command

from elmo_tf.beam.pipeline import ReadIndexedLines, lines_digest, shard_of
from elmo_tf.embed import embed_file
from elmo_tf.io.embeddings_shards import ShardError, merge_shards, open_shards, shard_path
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
MAX_TOKENS = 6  # --max-sentence-tokens: LINES[5] (15 tokens) is split into pieces of 6, 6 and 3


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
    embed_file(model, text, tmp / "embed.hdf5", batch_size=2, max_sentence_tokens=MAX_TOKENS)
    result = run_command(
        ["-m", "elmo_tf.beam", "--options", tmp / "model" / "options.json", "--weights", tmp / "model" / "weights.hdf5"]
        + ["--input", text, "--output", tmp / "out" / "emb", "--num-shards", SHARDS, "--batch-size", "2"]
        + ["--max-sentence-tokens", MAX_TOKENS]
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
        options="",
        weights="",
        input=str(text),
        output="",
        batch_size=2,
        dtype="float16",
        num_shards=1,
        max_sentence_tokens=MAX_TOKENS,
    )
    sentences = list(iter_sentences(text))
    counts = write_shard(Embedder(model, "all"), iter(sentences), tmp_path / "s.hdf5", config)
    assert counts == {"sentences": len(LINES), "tokens": sum(len(s.tokens) for s in sentences)}
    embed_file(model, text, tmp_path / "e16.hdf5", batch_size=2, dtype="float16", max_sentence_tokens=MAX_TOKENS)
    arrays, index = read(tmp_path / "s.hdf5")
    expected, expected_index = read(tmp_path / "e16.hdf5")
    assert index == expected_index and set(arrays) == set(expected)
    float32, _ = read(tmp / "embed.hdf5")
    for name, array in arrays.items():
        assert array.dtype == np.float16 and expected[name].dtype == np.float16, name
        np.testing.assert_array_equal(array, expected[name], err_msg=name)
        np.testing.assert_array_equal(array, float32[name].astype(np.float16), err_msg=name)


def shard_lines(text, shard):
    """The `Sentence`s of shard `shard` of `SHARDS` of `text`, uncut (as a worker gets them)."""
    sentences = list(iter_sentences(text))
    return [s for s in sentences if shard_of(s.index, len(sentences), SHARDS) == shard]


def test_shards_carry_the_runs_fingerprint_and_their_place(run):
    """shard.index/shard.count, and the same run.* entries in every shard: the model's fingerprint (options and
    weights), layers, dtype, precision, the input's lines' digest, the settings (the bound on a sentence among them,
    which the content attributes state too) and the precision (`precision`, as embed's output says it); the merged file
    states the bound and the precision."""
    from elmo_tf.io.sentences import content_attrs
    from elmo_tf.models import load_elmo
    from elmo_tf.models.elmo import model_fingerprint

    tmp, text, result = run
    assert result.returncode == 0, result.stderr
    model = load_elmo(tmp / "model" / "options.json", tmp / "model" / "weights.hdf5")
    fingerprints = []
    for k in range(SHARDS):
        with h5py.File(shard_path(str(tmp / "out" / "emb"), k, SHARDS), "r") as f:
            attrs = dict(f.attrs)
        assert (attrs["shard.index"], attrs["shard.count"]) == (k, SHARDS)
        assert {name: attrs[name] for name in content_attrs(MAX_TOKENS, "split")} == content_attrs(MAX_TOKENS, "split")
        assert attrs["precision"] == "float32"
        fingerprints.append({name[4:]: json.loads(v) for name, v in attrs.items() if name.startswith("run.")})
    assert fingerprints[1] == fingerprints[0] and fingerprints[2] == fingerprints[0]
    fingerprint = fingerprints[0]
    assert fingerprint["model"] == model_fingerprint(model)
    lines = [s.line for s in iter_sentences(text)]
    assert fingerprint["input"] == lines_digest(lines) and fingerprint["input"]["lines"] == len(LINES)
    expected = {"layers": "all", "dtype": "float32", "precision": "float32", "batch_size": 2, "sort": True}
    assert {name: fingerprint[name] for name in expected} == expected
    assert (fingerprint["max_sentence_tokens"], fingerprint["long_sentences"]) == (MAX_TOKENS, "split")
    assert fingerprint["token_embeddings"] is None and fingerprint["sentence_index"] is True
    merged = tmp / "fingerprinted.hdf5"
    assert merge_shards(str(tmp / "out" / "emb"), merged) == len(LINES)
    with h5py.File(merged, "r") as f:
        assert f.attrs["max_sentence_tokens"] == MAX_TOKENS and f.attrs["long_sentences"] == "split"
        assert f.attrs["precision"] == "float32"


@pytest.mark.parametrize("other", ["layers", "model", "dtype", "input", "precision"])
def test_a_shard_of_another_run_is_refused(run, tmp_path, other):
    """Shards 0 and 2 of the pipeline's run (--layers all) with a shard 1 that the workers' code writes for another
    run: --layers top (arrays of another rank: the merge wrote a file of two shapes, exit 0), another model
    (another seed), --dtype float16, another input (a line changed), --precision bfloat16 (arrays of the same shape
    and dtype, values within bfloat16's rounding). One line: the file, the attribute, both values; exit 1; nothing
    written."""
    import keras
    from tiny_models import TINY

    from elmo_tf.beam.pipeline import ShardedEmbedConfig, shard_fingerprint, write_shard
    from elmo_tf.config import BiLMConfig
    from elmo_tf.embed import Embedder
    from elmo_tf.io.embeddings_shards import shard_attrs
    from elmo_tf.models import ELMo, load_elmo

    tmp, text, result = run
    assert result.returncode == 0, result.stderr
    prefix = str(tmp_path / "emb")
    for k in (0, 2):
        shutil.copy(shard_path(str(tmp / "out" / "emb"), k, SHARDS), shard_path(prefix, k, SHARDS))
    with h5py.File(shard_path(prefix, 0, SHARDS), "r") as f:
        ours = {name[4:]: f.attrs[name] for name in f.attrs if name.startswith("run.")}
    precision = "bfloat16" if other == "precision" else "float32"
    model = load_elmo(tmp / "model" / "options.json", tmp / "model" / "weights.hdf5", precision=precision)
    if other == "model":
        keras.utils.set_random_seed(99)
        model = ELMo(BiLMConfig(**TINY))
    layers = "top" if other == "layers" else "all"
    dtype = "float16" if other == "dtype" else "float32"
    lines = [s.line for s in iter_sentences(text)]
    if other == "input":
        lines[0] = b"The dog sat on the mat ."
    config = ShardedEmbedConfig(
        options="",
        weights="",
        input=str(text),
        output=prefix,
        batch_size=2,
        num_shards=SHARDS,
        layers=layers,
        dtype=dtype,
        max_sentence_tokens=MAX_TOKENS,
        precision=precision,
    )
    embedder = Embedder(model, layers)
    theirs = shard_fingerprint(embedder, config, lines_digest(lines))
    attrs = shard_attrs(theirs, 1, SHARDS)
    write_shard(embedder, iter(shard_lines(text, 1)), shard_path(prefix, 1, SHARDS), config, attrs)
    merged = run_command(["-m", "elmo_tf", "merge-shards", "--input", prefix, "--output", tmp_path / "m.hdf5"])
    assert_one_error(
        merged,
        1,
        f"emb-00001-of-00003.hdf5: attribute 'run.{other}' is {attrs['run.' + other]}",
        f"emb-00000-of-00003.hdf5 has {ours[other]}: shards of different runs",
    )
    assert ours[other] != attrs["run." + other]
    assert not (tmp_path / "m.hdf5").exists()


def test_an_incomplete_or_duplicated_set_of_shards_is_refused(run, tmp_path):
    """The pipeline's shards: only shard 0 given (the merge wrote a third of the lines, exit 0), the prefix with a
    shard removed, and shard 1 given twice: one line naming the first mismatch; nothing written."""
    tmp, _text, result = run
    assert result.returncode == 0, result.stderr
    out = str(tmp / "out" / "emb")
    merged = run_command(
        ["-m", "elmo_tf", "merge-shards", "--input", shard_path(out, 0, SHARDS), "--output", tmp_path / "m.hdf5"]
    )
    assert_one_error(merged, 1, "emb-00001-of-00003.hdf5: shard 1 of 3 is missing", "shard.index 0 of shard.count 3")
    prefix = str(tmp_path / "emb")
    for k in (0, 2):
        shutil.copy(shard_path(out, k, SHARDS), shard_path(prefix, k, SHARDS))
    with pytest.raises(ShardError, match=r"emb-00001-of-00003.hdf5: missing \(1 of 3 shards missing\)"):
        merge_shards(prefix, tmp_path / "m.hdf5")
    shutil.copy(shard_path(out, 1, SHARDS), tmp_path / "again.hdf5")
    twice = [shard_path(out, 0, SHARDS), shard_path(out, 1, SHARDS), tmp_path / "again.hdf5"]
    with pytest.raises(ShardError, match=r"again.hdf5: attribute 'shard.index' is 1, as in .*emb-00001-of-00003.hdf5"):
        merge_shards(twice, tmp_path / "m.hdf5")
    assert not (tmp_path / "m.hdf5").exists()


def test_the_precision_option_reaches_the_workers_model(run):
    """`--precision` (a pipeline option, `ElmoTFOptions`) is resolved by the launcher into the config each worker
    loads its model with; the launcher's last line says it (the pipeline's run: float32, the default)."""
    from elmo_tf.beam.pipeline import ShardedEmbedConfig, load_model

    tmp, text, result = run
    assert result.returncode == 0, result.stderr
    assert "shards" in result.stderr and "computed in float32" in result.stderr
    model = tmp / "model"
    config = ShardedEmbedConfig(
        str(model / "options.json"), str(model / "weights.hdf5"), str(text), "x", precision="bfloat16"
    )
    assert load_model(config).model.precision == "bfloat16"
