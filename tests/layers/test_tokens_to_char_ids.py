"""elmo_tf/layers/tokens_to_char_ids.py: tf.string tokens padded with "" -> the original's char ids, in a model."""

import numpy as np
import tensorflow as tf

from elmo_tf.layers import TokensToCharIds

SENTENCES = [["Hello", "world", "!"], ["naïve", "日本語", "<S>", "</S>"], ["z" * 70], []]


def padded(sentences):
    """Token lists -> a str array `(batch, longest)` padded with ""."""
    width = max(len(s) for s in sentences)
    return np.array([s + [""] * (width - len(s)) for s in sentences], dtype=str)


def test_equals_the_numpy_mapping(to_char_ids):
    out = np.asarray(TokensToCharIds()(tf.constant(padded(SENTENCES))))
    assert out.dtype == np.int32 and out.shape == (4, 4, 50)
    np.testing.assert_array_equal(out, to_char_ids(SENTENCES))  # all-zero rows for ""


def test_layer_contract(layer_contract):
    """Config, shapes, padding and batch-mates, `.keras` reload in another process (tests/layer_testlib.py)."""
    longer = [["a", "much", "longer", "sentence", "of", "tokens", "!"]]
    layer, ids = layer_contract(TokensToCharIds, {}, padded(SENTENCES), pad_value="", batch_mates=padded(longer))
    assert not layer.trainable and layer.weights == []
    assert ids[0, 0, :7].tolist() == [259, 73, 102, 109, 109, 112, 260]  # <bow> H e l l o <eow>, each id + 1
