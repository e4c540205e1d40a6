"""elmo_tf/io/token_cache.py: one `TokenCache` for the in-graph lookup (the ELMo model) and the host-side one (the
embedder), read from the dump-token-embeddings file."""

import numpy as np
import pytest
import tensorflow as tf

from elmo_tf.errors import ElmoTFError
from elmo_tf.io.token_cache import TokenCache
from elmo_tf.io.token_embeddings import TokenEmbeddingError, write_token_embeddings

# str and bytes, non-ASCII, invalid UTF-8 (as bytes and as the str surrogateescape decoding gives), boundaries
VOCABULARY = ["the", b"cat", "naïve", b"caf\xe9", "bad\udcff", "<S>", "x" * 60]
AS_BYTES = [b"the", b"cat", "naïve".encode(), b"caf\xe9", b"bad\xff", b"<S>", b"x" * 60]


def embedding(rows=7, width=4):
    return np.arange(rows * width, dtype=np.float32).reshape(rows, width) + 1.0


def test_the_host_and_the_graph_lookups_give_the_same_rows():
    cache = TokenCache(VOCABULARY, embedding())
    assert cache.tokens == AS_BYTES and len(cache) == 7 and cache.projection_dim == 4
    queries = AS_BYTES + [b"dog", b"", b"The", b"x" * 48]
    host = [cache.row(token) for token in queries]
    assert host == [0, 1, 2, 3, 4, 5, 6, None, None, None, None]
    ids = cache.lookup(tf.constant([queries[:6], queries[6:12] + [b""]]))
    np.testing.assert_array_equal(ids.numpy().ravel()[: len(queries)], [1, 2, 3, 4, 5, 6, 7, 0, 0, 0, 0])
    vectors = cache.gather(ids).numpy().reshape(-1, 4)[: len(queries)]
    for row, vector in zip(host, vectors):
        np.testing.assert_array_equal(vector, np.zeros(4) if row is None else cache.embedding[row])


def test_the_graph_side_is_made_once_and_works_from_inside_a_tf_function():
    cache = TokenCache(VOCABULARY, embedding())

    @tf.function
    def vectors(tokens):
        return cache.gather(cache.lookup(tokens))

    got = vectors(tf.constant(["cat", "dog"])).numpy()  # first use inside the trace: made eagerly (init_scope)
    np.testing.assert_array_equal(got, [cache.embedding[1], np.zeros(4)])
    table, variable = cache.in_graph()
    assert cache.in_graph()[0] is table and cache.in_graph()[1] is variable
    assert not variable.trainable and variable.shape == (8, 4)
    np.testing.assert_array_equal(vectors(tf.constant(["<S>"])).numpy(), cache.embedding[5:6])


def test_load_reads_the_dump_token_embeddings_file(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_bytes(b"\n".join(AS_BYTES) + b"\n")
    path = tmp_path / "token_embeddings.hdf5"
    write_token_embeddings(path, embedding(), vocabulary=AS_BYTES)
    for vocabulary in (vocab, str(vocab), AS_BYTES, VOCABULARY):
        cache = TokenCache.load(path, vocabulary, projection_dim=4)
        assert cache.tokens == AS_BYTES
        np.testing.assert_array_equal(cache.embedding, embedding())
    with pytest.raises(TokenEmbeddingError, match="was written for another vocabulary"):
        TokenCache.load(path, AS_BYTES[::-1])
    with pytest.raises(TokenEmbeddingError, match="width 4, but the model's projection_dim is 8"):
        TokenCache.load(path, vocab, projection_dim=8)


def test_errors_name_the_argument_and_the_values():
    expected = r"^token_embeddings must have shape \(7, 8\) for 7 tokens and projection_dim 8, got \(7, 4\)$"
    with pytest.raises(ElmoTFError, match=expected):
        TokenCache(VOCABULARY, embedding(), projection_dim=8, name="token_embeddings")
    with pytest.raises(ElmoTFError, match=r"^embedding must have shape \(7, P\) for 7 tokens, got \(6, 4\)$"):
        TokenCache(VOCABULARY, embedding(rows=6))
    with pytest.raises(ElmoTFError, match=r"embedding must have shape \(7, P\) for 7 tokens, got \(28,\)"):
        TokenCache(VOCABULARY, embedding().ravel())
    with pytest.raises(ElmoTFError, match="vocabulary must hold distinct, non-empty tokens"):
        TokenCache(["a", b"a"], embedding(rows=2))
    with pytest.raises(ElmoTFError, match="vocabulary must hold distinct, non-empty tokens"):
        TokenCache(["a", ""], embedding(rows=2))
    with pytest.raises(ElmoTFError, match="token_embeddings must be a TokenCache or a .vocabulary, embedding. pair"):
        TokenCache.of(embedding(), 4)


def test_of_takes_a_cache_as_it_is_or_a_pair():
    cache = TokenCache(VOCABULARY, embedding())
    assert TokenCache.of(cache, 4) is cache
    with pytest.raises(ElmoTFError, match=r"^token_embeddings must have shape \(7, 16\) for 7 tokens and projection"):
        TokenCache.of(cache, 16)
    pair = TokenCache.of((VOCABULARY, embedding()), 4)
    assert pair.tokens == AS_BYTES and pair.embedding.dtype == np.float32
