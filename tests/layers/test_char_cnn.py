"""elmo_tf/layers/char_cnn.py: char embedding -> VALID conv per width -> max -> activation -> highway -> projection."""

import numpy as np
import pytest
import tensorflow as tf

from elmo_tf.layers import CharCNN

FILTERS = ((1, 4), (2, 8), (3, 5))


def numpy_char_cnn(char_ids, layer, activation="relu"):
    """bilm-tf's token encoder in float64 NumPy. Per DESIGN.md (and bilm-tf/AllenNLP), `activation` is
    applied after the max-pool; the highway's transform branch is always relu."""
    act = {"relu": lambda v: np.maximum(v, 0.0), "tanh": np.tanh}[activation]
    emb = layer.char_embedding.numpy().astype(np.float64)
    batch, tokens, chars = char_ids.shape
    out = np.zeros([batch, tokens, layer.projection_dim])
    for b in range(batch):
        for t in range(tokens):
            ids = char_ids[b, t]
            if not ids.any():
                continue  # padding row: no token, zero vector
            x = emb[ids]  # (chars, dim)
            pooled = []
            for (width, _), kernel, bias in zip(layer.filters, layer.conv_kernels, layer.conv_biases):
                kernel = kernel.numpy().astype(np.float64)  # (width, dim, n)
                conv = (
                    np.stack([np.einsum("wd,wdn->n", x[p : p + width], kernel) for p in range(chars - width + 1)])
                    + bias.numpy()
                )
                pooled.append(act(conv.max(axis=0)))
            h = np.concatenate(pooled)
            hw = layer.highway
            for k in range(hw.num_layers):
                g = 1.0 / (1.0 + np.exp(-(h @ hw.carry_kernels[k].numpy() + hw.carry_biases[k].numpy())))
                h = (
                    g * np.maximum(h @ hw.transform_kernels[k].numpy() + hw.transform_biases[k].numpy(), 0.0)
                    + (1.0 - g) * h
                )
            if layer.use_projection:
                h = h @ layer.projection.kernel.numpy() + layer.projection.bias.numpy()
            out[b, t] = h
    return out


def make_cnn(randomize, filters=FILTERS, projection_dim=6, num_highway=2, activation="relu", seed=0):
    layer = CharCNN(
        filters, num_highway=num_highway, projection_dim=projection_dim, char_embedding_dim=3, activation=activation
    )
    layer.build((None, None, 50))
    randomize(layer, seed=seed, scale=0.5)
    return layer


SENTENCES = [["Hello", "world", "!"], ["naïve", "日本語", "<S>", "</S>"], ["z" * 70], []]


@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_matches_numpy(activation, randomize, to_char_ids):
    layer = make_cnn(randomize, activation=activation)
    ids = to_char_ids(SENTENCES)
    out = np.asarray(layer(ids))
    assert out.shape == (4, 4, 6) and out.dtype == np.float32
    np.testing.assert_allclose(out, numpy_char_cnn(ids, layer, activation), atol=1e-5, rtol=0)


def test_without_projection_when_filter_total_equals_projection_dim(randomize, to_char_ids):
    layer = make_cnn(randomize, filters=((1, 4), (2, 4)), projection_dim=8, num_highway=1)
    assert not layer.use_projection
    ids = to_char_ids(SENTENCES)
    np.testing.assert_allclose(np.asarray(layer(ids)), numpy_char_cnn(ids, layer), atol=1e-5, rtol=0)


def test_padding_rows_give_zero_vectors_and_tokens_are_context_free(randomize, to_char_ids):
    layer = make_cnn(randomize)
    # row 0 of the char embedding is non-zero here: padding must still give exact zeros
    assert np.abs(layer.char_embedding.numpy()[0]).max() > 0
    ids = to_char_ids([["a", "bb"], ["bb"], []], num_tokens=5)
    out = np.asarray(layer(ids))
    assert not out[0, 2:].any() and not out[1, 1:].any() and not out[2].any()
    assert np.abs(out[0, :2]).min(axis=-1).max() > 0
    np.testing.assert_array_equal(out[0, 1], out[1, 0])  # the same token gives the same vector anywhere
    np.testing.assert_array_equal(np.asarray(layer.compute_mask(ids)), ids.any(axis=-1))


@pytest.mark.parametrize("shape", [(0, 3), (2, 0), (2, 3)], ids=["empty-batch", "no-tokens", "all-padding"])
def test_no_real_tokens(shape, randomize):
    """A batch without any real token (empty batch, zero-length or all-padding input) gives zeros."""
    layer = make_cnn(randomize)
    out = np.asarray(layer(np.zeros(shape + (50,), np.int32)))
    assert out.shape == shape + (6,)
    assert not out.any()


def test_input_validation(randomize):
    layer = make_cnn(randomize)
    with pytest.raises(TypeError, match="float32"):
        layer(np.zeros((1, 2, 50), np.float32))
    with pytest.raises(ValueError, match="shape"):
        layer(np.zeros((2, 50), np.int32))
    with pytest.raises(ValueError, match="shape"):
        layer(np.ones((1, 2, 49), np.int32))
    with pytest.raises(ValueError, match="filters"):
        CharCNN(())
    with pytest.raises(ValueError, match=r"\(51, 2\)"):
        CharCNN(((51, 2),))
    with pytest.raises(ValueError, match="projection_dim"):
        CharCNN(FILTERS, projection_dim=0)


def test_int64_ids_accepted(randomize, to_char_ids):
    layer = make_cnn(randomize)
    ids = to_char_ids(SENTENCES[:2])
    np.testing.assert_array_equal(np.asarray(layer(ids.astype(np.int64))), np.asarray(layer(ids)))


def test_get_config_round_trip(randomize, to_char_ids):
    layer = make_cnn(randomize, activation="tanh")
    clone = CharCNN.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
    assert clone.filters == FILTERS and clone.projection_dim == 6 and clone.num_highway == 2
    clone.build((None, None, 50))
    clone.set_weights(layer.get_weights())
    ids = to_char_ids(SENTENCES)
    np.testing.assert_array_equal(np.asarray(clone(ids)), np.asarray(layer(ids)))


def test_gradients_reach_every_weight(randomize, to_char_ids):
    layer = make_cnn(randomize)
    ids = tf.constant(to_char_ids(SENTENCES[:2]))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(layer(ids)))
    grads = tape.gradient(loss, layer.trainable_weights)
    assert len(grads) == len(layer.weights)
    for var, grad in zip(layer.trainable_weights, grads):
        assert grad is not None and np.abs(np.asarray(tf.convert_to_tensor(grad))).max() > 0, var.path
