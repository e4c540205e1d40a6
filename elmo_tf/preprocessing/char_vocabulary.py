"""Tokens -> char ids by a char vocabulary (ELMoForManyLangs' mapping), in TF ops, plus the byte mapping's twin.

ELMoForManyLangs (HIT-SCIR) maps a token's Unicode code points, not its UTF-8 bytes: each code point is looked up
in the model's char vocabulary (`<oov>`'s id when missing), the token is cut to its first `max_chars - 2` code
points, and the row is `[bow, chars..., eow, pad, ...]` with `max_chars` entries. Which ids stand for bow / eow /
pad / oov / the sentence boundaries comes from the model (`special_ids`): its released code writes `<eow>`'s id
first and `<bow>`'s last (a swap in `create_one_batch` that training had too), so a converted model says
`bow = id of <eow>`, `eow = id of <bow>`. Every id is shifted by +1 (here, once), so an all-zero row still means
"no token" and the char embedding gets a zero row 0 in front of the model's rows.

With a word vocabulary, the row gets one more column: 1 + the word's id (the token cut to `max_chars - 2` code
points, looked up whole; the `oov` word id when missing), 0 for padding. The char CNN embeds that column and puts
the word vector before its filters (`CharCNN(word_vocab_size=...)`).

Both lookups are `tf.lookup.StaticHashTable`s built from the vocabularies in memory, so a SavedModel carries them
and takes raw strings.
"""

import tensorflow as tf

from elmo_tf.preprocessing.char_rows import (  # noqa: F401 (the names long imported from here)
    BOS_TOKEN,
    BYTE_MAPPING,
    CHAR_SPECIALS,
    EOS_TOKEN,
    WORD_SPECIALS,
    ByteCharMapping,
    VocabularyRows,
)
from elmo_tf.preprocessing.chars import MAX_CHARS


def _table(vocabulary, default):
    keys = tf.constant([entry for entry, _ in vocabulary], tf.string)
    values = tf.constant([i for _, i in vocabulary], tf.int64)
    return tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(keys, values), default_value=default)


class VocabularyCharMapping(tf.Module):
    """Code points looked up in a char vocabulary (ELMoForManyLangs), optionally with a word id column.

    Args:
        char_vocabulary: `(entry, id)` pairs; single-code-point entries are what tokens' chars match.
        special_ids: dict with the ids (in the vocabulary, before the +1 shift) written for each of `CHAR_SPECIALS`:
            `bow` first in a token, `eow` after its last char, `pad` after that, `oov` for a char not in the
            vocabulary, `bos`/`eos` the char of the sentence-boundary tokens.
        word_vocabulary: `(entry, id)` pairs, or None for no word column.
        word_special_ids: dict with the word ids of `WORD_SPECIALS` (with `word_vocabulary`).
        max_chars: row length (50).
    Call arguments:
        tokens: tf.string of any shape, "" for padding.
    Returns:
        int32 `tokens.shape + (width,)`: `width` = max_chars (+1 with a word vocabulary); all-zero rows for "".
    """

    def __init__(self, char_vocabulary, special_ids, word_vocabulary=None, word_special_ids=None, max_chars=MAX_CHARS):
        super().__init__(name="char_mapping")  # a tf.Module: the SavedModel tracks its tables
        rows = VocabularyRows(char_vocabulary, special_ids, word_vocabulary, word_special_ids, max_chars)
        self.special, self.max_chars, self.width, self.pad_id = rows.special, max_chars, rows.width, rows.pad_id
        self.bos_row, self.eos_row, self.empty_row = rows.bos_row, rows.eos_row, rows.empty_row
        self.chars = _table(char_vocabulary, special_ids["oov"])
        self.words = None
        if word_vocabulary is not None:
            self.words = _table(word_vocabulary, word_special_ids["oov"])

    def __call__(self, tokens):
        tokens = tf.convert_to_tensor(tokens)
        if tokens.dtype != tf.string:
            raise TypeError(f"tokens must be a tf.string tensor, got dtype {tokens.dtype.name}")
        flat = tf.reshape(tokens, [-1])
        cut = self.max_chars - 2
        chars = tf.strings.unicode_split(flat, "UTF-8", errors="replace")[:, :cut]
        ids = tf.cast(tf.ragged.map_flat_values(self.chars.lookup, chars), tf.int32) + 1
        body = ids.to_tensor(default_value=self.pad_id, shape=[None, cut])
        n = tf.cast(chars.row_lengths(), tf.int32)[:, None]
        body = tf.concat([tf.zeros_like(body[:, :1]), body, tf.zeros_like(body[:, :1])], axis=1)
        pos = tf.range(self.max_chars, dtype=tf.int32)
        s = self.special
        rows = tf.where(pos == 0, s["bow"], tf.where(pos <= n, body, tf.where(pos == n + 1, s["eow"], s["pad"])))
        if self.words is not None:
            word_key = tf.strings.reduce_join(chars, axis=-1)  # the token cut to max_chars - 2 code points
            word = tf.cast(self.words.lookup(word_key), tf.int32) + 1
            rows = tf.concat([rows, word[:, None]], axis=1)
        rows = tf.where((flat == BOS_TOKEN)[:, None], tf.constant(self.bos_row), rows)
        rows = tf.where((flat == EOS_TOKEN)[:, None], tf.constant(self.eos_row), rows)
        rows = tf.where((flat == "")[:, None], 0, rows)
        return tf.reshape(rows, tf.concat([tf.shape(tokens), [self.width]], axis=0))

    def numpy(self, tokens):
        """The same for a list of `str`/`bytes` tokens: `(n, width)` int32."""
        tokens = [t.encode("utf-8", "surrogateescape") if isinstance(t, str) else bytes(t) for t in tokens]
        return self(tf.constant(tokens, tf.string, shape=[len(tokens)])).numpy()
