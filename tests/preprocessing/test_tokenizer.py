"""elmo_tf/preprocessing/tokenizer.py: whitespace tokenization in TF ops."""

import numpy as np
import pytest
import tensorflow as tf

from elmo_tf.preprocessing.tokenizer import whitespace_tokenize


def as_lists(tokens, lengths):
    return [[t.decode("utf-8") for t in row[:n]] for row, n in zip(tokens.numpy(), lengths.numpy())]


def test_splits_on_runs_of_ascii_whitespace():
    sentences = ["The  cat\tsat\n", "  lone  ", "a\x0bb\x0cc\rd\r\ne", "one"]
    tokens, lengths = whitespace_tokenize(tf.constant(sentences))
    assert tokens.dtype == tf.string and lengths.dtype == tf.int32
    assert lengths.numpy().tolist() == [3, 1, 5, 1]
    assert tokens.shape == (4, 5)
    assert as_lists(tokens, lengths) == [["The", "cat", "sat"], ["lone"], ["a", "b", "c", "d", "e"], ["one"]]
    # padded with ""
    assert tokens.numpy()[1].tolist() == [b"lone", b"", b"", b"", b""]
    # the same split as Python's bytes.split() (ASCII whitespace), line by line
    for sentence, row in zip(sentences, as_lists(tokens, lengths)):
        assert row == sentence.split(), sentence


def test_non_ascii_whitespace_does_not_split():
    tokens, lengths = whitespace_tokenize(tf.constant(["x\u00a0y z", "p\u2003q"]))
    assert lengths.numpy().tolist() == [2, 1]
    assert tokens.numpy()[0, 0] == "x\u00a0y".encode("utf-8")
    assert tokens.numpy()[1, 0] == "p\u2003q".encode("utf-8")


def test_empty_sentence_is_a_row_of_empty_strings():
    tokens, lengths = whitespace_tokenize(tf.constant(["a b c", "", "   \t "]))
    assert lengths.numpy().tolist() == [3, 0, 0]
    assert tokens.numpy()[1].tolist() == [b"", b"", b""]
    assert tokens.numpy()[2].tolist() == [b"", b"", b""]
    tokens, lengths = whitespace_tokenize(tf.constant(["", ""]))
    assert tokens.shape == (2, 0) and lengths.numpy().tolist() == [0, 0]


def test_empty_batch():
    tokens, lengths = whitespace_tokenize(tf.constant([], tf.string))
    assert tokens.shape == (0, 0) and tokens.dtype == tf.string
    assert lengths.shape == (0,) and lengths.dtype == tf.int32


def test_max_tokens_cuts_long_sentences():
    tokens, lengths = whitespace_tokenize(tf.constant(["a b c d e", "f g", ""]), max_tokens=3)
    assert tokens.shape == (3, 3)
    assert lengths.numpy().tolist() == [3, 2, 0]
    assert as_lists(tokens, lengths) == [["a", "b", "c"], ["f", "g"], []]


def test_runs_in_tf_data_map():
    ds = tf.data.Dataset.from_tensor_slices(["a b", "c d e", "", "f"]).batch(2).map(whitespace_tokenize)
    batches = [(t.numpy().tolist(), n.numpy().tolist()) for t, n in ds]
    assert batches == [([[b"a", b"b", b""], [b"c", b"d", b"e"]], [2, 3]), ([[b""], [b"f"]], [0, 1])]


def test_wrong_dtype_raises_type_error_naming_the_dtype():
    with pytest.raises(TypeError, match="int32"):
        whitespace_tokenize(tf.constant([1, 2]))
    with pytest.raises(TypeError, match="float"):
        whitespace_tokenize(np.array([1.5], np.float32))


@pytest.mark.parametrize("value", [[["a b", "c"]], "a b"], ids=["rank2", "rank0"])
def test_wrong_rank_raises_value_error(value):
    with pytest.raises(ValueError, match="rank"):
        whitespace_tokenize(tf.constant(value))
