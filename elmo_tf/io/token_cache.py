"""`TokenCache`: the precomputed context-free vectors of a vocabulary's tokens, one object for every reader.

The char CNN's vector of a token does not depend on its sentence, so the vectors of a vocabulary can be computed once
(`elmo_tf.io.token_embeddings`: the file of bilm-tf's `dump_token_embeddings` and AllenNLP's `vocab_to_cache`) and
looked up instead of computed. Two places look them up, both through this class:
    - in the graph, the ELMo model (`ELMo.use_token_embeddings`): `lookup(tokens)` maps a tf.string tensor to ids,
      1 + the token's row (0 for a word the cache does not hold and for padding ""), and `gather(ids)` gives their
      vectors (zeros for id 0);
    - on the host, the embedder (`elmo_tf.embed.Embedder`): `row(token)` gives a token's row (or None), and
      `embedding` holds the rows.

Example:
    cache = TokenCache.load("token_embeddings.hdf5", "vocab.txt", projection_dim=elmo.config.projection_dim)
    elmo.use_token_embeddings(cache)              # embed_tokens skips the char CNN for the cache's words
    Embedder(elmo, token_embeddings=cache)        # so does the embedder
"""

import os

import numpy as np

from elmo_tf.errors import ElmoTFError
from elmo_tf.io.token_embeddings import load_token_embeddings, read_vocabulary
from elmo_tf.preprocessing.chars import token_bytes


class TokenCache:
    """The vectors `embedding` `(V, P)` of the tokens of `vocabulary`, row j = token j.

    The host side (`row`, `embedding`) costs nothing beyond the arrays; the graph side (a `tf.lookup.StaticHashTable`
    and a `(1 + V, P)` variable, row 0 zeros) is created on first use (`in_graph`, `lookup`, `gather`).

    Args:
        vocabulary: sequence of V distinct, non-empty tokens (str as UTF-8, or bytes).
        embedding: float `(V, P)`; stored as float32.
        projection_dim: the width P the model expects (None: any).
        name: the argument named by the shape error (e.g. "token_embeddings").
    Raises:
        ElmoTFError: `embedding` not `(V, projection_dim)`, or tokens repeated or empty.
    """

    def __init__(self, vocabulary, embedding, projection_dim=None, name="embedding"):
        tokens = [token_bytes(t) for t in vocabulary]
        embedding = np.asarray(embedding, np.float32)
        self.tokens = tokens
        self.embedding = embedding
        self.check_width(projection_dim, name)
        self._rows = {token: row for row, token in enumerate(tokens)}
        if len(self._rows) != len(tokens) or b"" in self._rows:
            raise ElmoTFError("vocabulary must hold distinct, non-empty tokens", key="vocabulary")
        self._table = self._vectors = None

    @classmethod
    def load(cls, path, vocabulary, projection_dim=None):
        """Reads a token embedding file (`elmo_tf.io.token_embeddings.load_token_embeddings`, checked against the
        vocabulary) for `vocabulary`, a vocabulary file's path (`read_vocabulary`) or a sequence of tokens."""
        if isinstance(vocabulary, str | os.PathLike):
            vocabulary = read_vocabulary(vocabulary)
        tokens = [token_bytes(t) for t in vocabulary]
        return cls(tokens, load_token_embeddings(path, tokens, projection_dim=projection_dim), projection_dim)

    @classmethod
    def of(cls, value, projection_dim=None, name="token_embeddings"):
        """`value` if it is a `TokenCache` (its width checked), else a `TokenCache(*value)` of a
        `(vocabulary, embedding)` pair."""
        if isinstance(value, TokenCache):
            value.check_width(projection_dim, name)
            return value
        try:
            vocabulary, embedding = value
        except (TypeError, ValueError):
            raise ElmoTFError(
                f"{name} must be a TokenCache or a (vocabulary, embedding) pair, got {type(value).__name__}", key=name
            ) from None
        return cls(vocabulary, embedding, projection_dim, name)

    def check_width(self, projection_dim, name="embedding"):
        """ElmoTFError naming `name` unless `embedding` is `(V, projection_dim)` (any width for None)."""
        shape, size = self.embedding.shape, len(self.tokens)
        if len(shape) == 2 and shape[0] == size and projection_dim in (None, shape[1]):
            return
        width = "P" if projection_dim is None else projection_dim
        for_what = f"{size} tokens" + ("" if projection_dim is None else f" and projection_dim {projection_dim}")
        raise ElmoTFError(f"{name} must have shape ({size}, {width}) for {for_what}, got {shape}", key=name)

    @property
    def projection_dim(self):
        return self.embedding.shape[1]

    def __len__(self):
        return len(self.tokens)

    def row(self, token):
        """The row of `token` (bytes) in `embedding`, or None for a token the cache does not hold."""
        return self._rows.get(token)

    def lookup(self, tokens):
        """tf.string `(...)` -> int32 `(...)`: 1 + the token's row, 0 for tokens the cache does not hold and for ""."""
        import tensorflow as tf

        return self.in_graph()[0].lookup(tf.convert_to_tensor(tokens, tf.string))

    def gather(self, ids):
        """int `(...)` ids of `lookup` -> float32 `(..., P)`: the tokens' vectors, zeros for id 0."""
        import tensorflow as tf

        return tf.gather(self.in_graph()[1], ids)

    def in_graph(self):
        """`(table, vectors)`: the `tf.lookup.StaticHashTable` token -> id of `lookup` and the `(1 + V, P)` float32
        variable of `gather` (row 0 zeros), created on the first call (eagerly, even inside a tf.function)."""
        import tensorflow as tf

        if self._table is None:
            with tf.init_scope():  # created eagerly even when first used inside a tf.function
                self._table = tf.lookup.StaticHashTable(
                    tf.lookup.KeyValueTensorInitializer(
                        tf.constant(self.tokens, tf.string), tf.range(1, len(self.tokens) + 1, dtype=tf.int32)
                    ),
                    default_value=0,
                )
                padded = np.concatenate([np.zeros([1, self.projection_dim], np.float32), self.embedding])
                self._vectors = tf.Variable(padded, trainable=False, name="token_cache_vectors")
        return self._table, self._vectors


__all__ = ["TokenCache"]
