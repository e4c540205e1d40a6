"""elmo_tf/preprocessing/char_rows.py: the NumPy char mappings give the ids of the TensorFlow ones they stand in for
off TensorFlow (`VocabularyRows` for `VocabularyCharMapping`, the byte mapping's NumPy twin), token for token."""

import numpy as np
import pytest
import tensorflow as tf

from elmo_tf.preprocessing.char_rows import BYTE_MAPPING, CHAR_SPECIALS, VocabularyRows
from elmo_tf.preprocessing.char_vocabulary import VocabularyCharMapping

CHARS = [(c, i) for i, c in enumerate("abcdeé日本<>")] + [("<multi>", 11)]  # a multi-code-point entry never matches
SPECIAL = dict(zip(CHAR_SPECIALS, (12, 13, 14, 15, 16, 17)))
WORDS = [("abc", 0), ("日本", 1), ("a" * 48, 2), ("<oov>", 3), ("<bos>", 4), ("<eos>", 5)]
WORD_SPECIAL = {"oov": 3, "bos": 4, "eos": 5}
TOKENS = [
    "abc",
    "日本",
    "é",
    "zzz",  # chars not in the vocabulary: oov
    "a" * 60,  # cut to 48 code points, and so the word "a" * 48
    "<bos>",
    "<eos>",
    "<S>",
    "",
    b"ab\xffc",  # invalid UTF-8: one U+FFFD, an oov char
    b"\xe6\x97",  # a cut multi-byte sequence
    "ab\udcffc",  # a lone surrogate (surrogateescape's invalid byte)
]


@pytest.mark.parametrize("words", [False, True], ids=["chars", "chars-and-words"])
def test_vocabulary_rows_give_the_lookup_tables_ids(words):
    """`VocabularyRows.numpy` (Python dicts, no TensorFlow) equals `VocabularyCharMapping` (TensorFlow's tables, what
    a SavedModel carries) on known, unknown, cut, boundary, empty and invalid-UTF-8 tokens; the boundary rows too."""
    args = (CHARS, SPECIAL, WORDS if words else None, WORD_SPECIAL if words else None)
    rows, tables = VocabularyRows(*args), VocabularyCharMapping(*args)
    got = rows.numpy(TOKENS)
    np.testing.assert_array_equal(got, tables.numpy(TOKENS))
    assert got.shape == (len(TOKENS), 51 if words else 50) and not got[TOKENS.index("")].any()
    for name in ("bos_row", "eos_row", "empty_row"):
        np.testing.assert_array_equal(getattr(rows, name), getattr(tables, name))
    assert (rows.width, rows.pad_id) == (tables.width, tables.pad_id)
    assert got[3, 1] == SPECIAL["oov"] + 1 and got[0, 1] == 1  # "z" is oov; "a" is id 0, shifted


def test_the_byte_mapping_numpy_twin_equals_its_tensorflow_ops():
    """bilm-tf's mapping: `BYTE_MAPPING.numpy` equals `BYTE_MAPPING(tf.string)` (the model's own ids off TensorFlow)."""
    tokens = [t.encode("utf-8", "surrogateescape") if isinstance(t, str) else t for t in TOKENS]
    np.testing.assert_array_equal(BYTE_MAPPING.numpy(TOKENS), BYTE_MAPPING(tf.constant(tokens)).numpy())
