"""Token-embedding caches (the bilm-tf / AllenNLP `embedding` hdf5) used by the ELMo layer and by embed.

The fixture file `elmo_token_embeddings.hdf5` holds AllenNLP's own char-CNN outputs for `vocab_test.txt`: a model
reading its token vectors from that file must give the outputs it gives with its own char CNN.
"""

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import tensorflow as tf

from elmo_tf import load_elmo
from elmo_tf.embed import Embedder, embed_file
from elmo_tf.io.token_cache import TokenCache
from elmo_tf.io.token_embeddings import load_token_embeddings, read_vocabulary

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "elmo_fixtures" / "allennlp"
pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(), reason=f"fixture data not found at {FIXTURES}")
ATOL = 1e-6


@pytest.fixture(scope="module")
def fixture_cache():
    vocabulary = read_vocabulary(FIXTURES / "vocab_test.txt")
    return vocabulary, load_token_embeddings(FIXTURES / "elmo_token_embeddings.hdf5", vocabulary)


@pytest.fixture(scope="module")
def sentences():
    with open(FIXTURES / "sentences.json") as f:
        batches = json.load(f)
    return [s.split() for batch in batches for s in batch]


def padded(sentences):
    longest = max(len(s) for s in sentences)
    return tf.constant([s + [""] * (longest - len(s)) for s in sentences])


def test_elmo_layer_with_the_fixture_cache_equals_the_char_cnn(fixture_cache, sentences):
    elmo = load_elmo(FIXTURES / "options.json", FIXTURES / "lm_weights.hdf5")
    extra = [["Unseenword", "and", "zzzqqq", "the", "Xylophone", "."]]  # unknown words fall back to the char CNN
    tokens = padded(sentences[:12] + extra)
    plain = elmo.embed_tokens(tokens)
    elmo.use_token_embeddings(*fixture_cache)
    ids = elmo.token_ids(tokens).numpy()
    assert (ids[:-1] > 0).sum() > 50 and (ids[-1][[0, 2, 4]] == 0).all() and (ids == 0).sum() > 3
    cached = elmo.embed_tokens(tokens)
    for key in ("word_emb", "elmo", "default"):
        np.testing.assert_allclose(cached[key].numpy(), plain[key].numpy(), atol=ATOL, rtol=0, err_msg=key)
    for a, b in zip(cached["activations"], plain["activations"]):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=ATOL, rtol=0)
    # the cache is really read: a changed row changes that word's vectors
    vocabulary, array = fixture_cache
    shifted = array.copy()
    shifted[vocabulary.index(b"the")] += 1.0
    elmo.use_token_embeddings(vocabulary, shifted)
    moved = elmo.embed_tokens(tokens)["word_emb"].numpy()
    assert np.abs(moved - plain["word_emb"].numpy()).max() > 0.5
    elmo.use_token_embeddings(None, None)
    np.testing.assert_array_equal(elmo.embed_tokens(tokens)["word_emb"].numpy(), plain["word_emb"].numpy())


def test_elmo_layer_cache_errors(fixture_cache):
    elmo = load_elmo(FIXTURES / "options.json", FIXTURES / "lm_weights.hdf5")
    vocabulary, array = fixture_cache
    with pytest.raises(ValueError, match="token-embedding cache"):
        elmo.token_ids(tf.constant([["a"]]))
    with pytest.raises(ValueError, match=r"shape \(458, 16\)"):
        elmo.use_token_embeddings(vocabulary, array[:, :8])
    with pytest.raises(ValueError, match="distinct"):
        elmo.use_token_embeddings(vocabulary[:2] + vocabulary[:1], array[:3])


@pytest.mark.parametrize("order", ["sorted", "corpus"])
def test_embed_with_the_fixture_cache_equals_the_char_cnn(fixture_cache, sentences, tmp_path, order):
    elmo = load_elmo(FIXTURES / "options.json", FIXTURES / "lm_weights.hdf5")
    path = tmp_path / "in.txt"
    lines = [" ".join(s) for s in sentences] + ["Unseenword zzzqqq the .", ""]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    stats = {}
    for name, cache in (("plain", None), ("cached", fixture_cache)):
        stats[name] = embed_file(
            elmo, path, tmp_path / f"{name}.hdf5", batch_size=4, sort=order == "sorted", token_embeddings=cache
        )
    assert stats["plain"]["cached"] == 0 and stats["cached"]["cached"] > 100
    assert stats["cached"]["cached"] < stats["cached"]["distinct"]  # the unknown words went through the char CNN
    with h5py.File(tmp_path / "plain.hdf5", "r") as a, h5py.File(tmp_path / "cached.hdf5", "r") as b:
        assert set(a) == set(b) == {str(i) for i in range(len(lines))} | {"sentence_to_index"}
        for key in a:
            if key != "sentence_to_index":
                np.testing.assert_allclose(b[key][...], a[key][...], atol=ATOL, rtol=0, err_msg=key)


def test_embedder_refuses_a_cache_of_the_wrong_width(fixture_cache):
    elmo = load_elmo(FIXTURES / "options.json", FIXTURES / "lm_weights.hdf5")
    vocabulary, array = fixture_cache
    with pytest.raises(ValueError, match="token_embeddings must have shape"):
        Embedder(elmo, token_embeddings=(vocabulary, array[:, :4]))


def test_one_cache_object_serves_the_model_and_the_embedder(sentences):
    """A `TokenCache` read from the dump-token-embeddings file, attached to the model and given to the embedder: the
    same object in both, the same outputs as the char CNN (1e-6), its words looked up in both."""
    elmo = load_elmo(FIXTURES / "options.json", FIXTURES / "lm_weights.hdf5")
    batch = sentences[:6] + [["Unseenword", "the", "zzzqqq", "."]]
    plain = [np.asarray(a) for a in elmo.embed_tokens(padded(batch))["activations"]]
    cache = TokenCache.load(FIXTURES / "elmo_token_embeddings.hdf5", FIXTURES / "vocab_test.txt", projection_dim=16)
    elmo.use_token_embeddings(cache)
    embedder = Embedder(elmo, "all", token_embeddings=cache, memo_size=0)
    assert elmo.token_cache is cache and embedder.token_cache is cache
    ids = elmo.token_ids(padded(batch)).numpy()
    assert (ids[-1, :4] > 0).tolist() == [False, True, False, True] and not ids[-1, 4:].any()
    cached = [np.asarray(a) for a in elmo.embed_tokens(padded(batch))["activations"]]
    embedded = embedder.embed_batch(batch)
    assert embedder.stats["cached"] > 30 and embedder.stats["cached"] < embedder.stats["distinct"]
    for b, sentence in enumerate(batch):
        n = len(sentence)
        for k in range(len(plain)):
            np.testing.assert_allclose(cached[k][b], plain[k][b], atol=ATOL, rtol=0)
            np.testing.assert_allclose(embedded[b][k], plain[k][b, :n], atol=ATOL, rtol=0)
    elmo.use_token_embeddings(None)
    assert elmo.token_cache is None
