"""elmo_tf/embed/output.py: float16 outputs (each value the float32 one rounded), values float16 cannot hold, lines
embedded apart written as outputs of their own and merged into the whole file."""

import json

import numpy as np
import pytest
from embed_testlib import FIXTURES, long_input, read_output, write_lines

from elmo_tf.embed import embed_file
from elmo_tf.io.sentences import iter_sentences


@pytest.fixture
def input_file(tmp_path):
    return write_lines(tmp_path)


# ---------------------------------------------------------------- float16 outputs

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


# ---------------------------------------------------------------- pieces of an input, merged


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
