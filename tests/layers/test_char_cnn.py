"""elmo_tf/layers/char_cnn.py: char embedding -> VALID conv per width -> max -> activation -> highway -> projection."""

import numpy as np
import pytest
import tensorflow as tf
from layer_testlib import any_nonzero

from elmo_tf.layers import CharCNN

FILTERS = ((1, 4), (2, 8), (3, 5))


def numpy_char_cnn(char_ids, layer, activation="relu"):
    """bilm-tf's token encoder in float64 NumPy. As in bilm-tf and AllenNLP, `activation` is
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
    # the same token gives the same vector anywhere (up to float rounding: a row's place in a batch can change
    # the kernels' blocking)
    np.testing.assert_allclose(out[0, 1], out[1, 0], atol=1e-6, rtol=0)
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


@pytest.mark.parametrize(
    "filters,activation,precision",
    [(FILTERS, "tanh", "float32"), (((1, 4), (2, 2)), "relu", "float32"), (FILTERS, "relu", "bfloat16")],
    ids=["projection-tanh", "no-projection", "projection-bfloat16"],
)
def test_layer_contract(filters, activation, precision, to_char_ids, layer_contract):
    """Config, shapes, the mask of real tokens, padding and batch-mates, `.keras` reload in another process
    (tests/layer_testlib.py)."""
    init = dict(filters=filters, num_highway=2, projection_dim=6, char_embedding_dim=3, activation=activation)
    init["precision"] = precision
    longer = [["a", "much", "longer", "sentence", "of", "tokens", "!"], ["x"] * 6]
    layer, _ = layer_contract(
        CharCNN,
        init,
        to_char_ids(SENTENCES),
        pad_value=0,
        batch_mates=to_char_ids(longer),
        output_mask=any_nonzero,
        weight_scale=0.5,
    )
    assert layer.use_projection == (filters == FILTERS)
    assert layer.precision == layer.highway.precision == precision


def test_gradients_reach_every_weight(randomize, to_char_ids):
    layer = make_cnn(randomize)
    ids = tf.constant(to_char_ids(SENTENCES[:2]))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(layer(ids)))
    grads = tape.gradient(loss, layer.trainable_weights)
    assert len(grads) == len(layer.weights)
    for var, grad in zip(layer.trainable_weights, grads):
        assert grad is not None and np.abs(np.asarray(tf.convert_to_tensor(grad))).max() > 0, var.path


# --- the convolutions run over the batch's longest token only (CharCNN.encode_tokens) ---

from elmo_tf.layers.backends.tensorflow_fast_paths import CUT_WIDTH_MULTIPLE  # noqa: E402
from elmo_tf.preprocessing.chars import PAD  # noqa: E402

WIDEST = max(width for width, _ in FILTERS)


def full_width_tokens(layer, char_ids):
    """The token encoder over all 50 positions of every row (no cut): the reference for the cut."""
    x = tf.gather(layer.char_embedding, char_ids)
    pooled = [
        layer.activation(tf.reduce_max(tf.nn.conv1d(x, kernel, 1, "VALID") + bias, axis=1))
        for kernel, bias in zip(layer.conv_kernels, layer.conv_biases)
    ]
    h = layer.highway(tf.concat(pooled, axis=-1))
    return layer.projection(h) if layer.use_projection else h


def padding_window_dominant(layer):
    """Makes the padding char's embedding large along every kernel, so an all-padding window is the max of many
    filters: a cut that forgot that window would give other values."""
    emb = layer.char_embedding.numpy()
    emb[PAD] = 4.0 * np.sign(sum(k.numpy().sum(axis=(0, 2)) for k in layer.conv_kernels))
    layer.char_embedding.assign(emb)


@pytest.fixture
def conv_widths(monkeypatch):
    """Records the char-axis length of every conv1d input."""
    widths, conv1d = [], tf.nn.conv1d

    def spy(x, *args, **kwargs):
        widths.append(int(x.shape[1]))
        return conv1d(x, *args, **kwargs)

    monkeypatch.setattr(tf.nn, "conv1d", spy)
    return widths


def test_cut_to_the_longest_token_gives_the_values_of_all_positions(randomize, to_char_ids, conv_widths):
    layer = make_cnn(randomize)
    padding_window_dominant(layer)
    sentences = [["a", "to", "word"], ["longest"], ["<S>", "x"]]
    ids = to_char_ids(sentences)
    out = np.asarray(layer(ids))
    longest = len("longest") + 2  # with begin / end of word
    rounded = -(-(longest + WIDEST - 1) // CUT_WIDTH_MULTIPLE) * CUT_WIDTH_MULTIPLE
    assert set(conv_widths) == {rounded}, conv_widths
    np.testing.assert_allclose(out, numpy_char_cnn(ids, layer), atol=1e-5, rtol=0)
    # the case is a real one: over the cut positions alone, the longest token's filters differ
    flat = ids.reshape(-1, 50)[ids.reshape(-1, 50).any(axis=1)]
    cut = np.asarray(full_width_tokens(layer, flat[:, : longest + WIDEST - 1]))
    full = np.asarray(full_width_tokens(layer, flat))
    assert np.abs(cut - full).max() > 1e-3
    np.testing.assert_allclose(np.asarray(layer.encode_tokens(flat)), full, atol=1e-5, rtol=0)


def test_cut_widths_are_few_whatever_the_longest_token(randomize, to_char_ids, conv_widths):
    """The cut width is rounded up to a multiple of CUT_WIDTH_MULTIPLE (capped at 50): tokens of 1 to 40 bytes meet
    at most 11 conv input widths, not 40 (TensorFlow's oneDNN convolutions keep a compiled primitive per shape, and
    a long embed run's RSS grew with the widths met), and every value is still that of all 50 positions."""
    layer = make_cnn(randomize)
    padding_window_dominant(layer)
    for n in range(1, 41):
        ids = to_char_ids([["a", "q" * n]])
        np.testing.assert_allclose(np.asarray(layer(ids)), numpy_char_cnn(ids, layer), atol=1e-5, rtol=0)
    widths = set(conv_widths)
    assert all(w % CUT_WIDTH_MULTIPLE == 0 or w == 50 for w in widths), widths
    assert len(widths) <= 11, widths


@pytest.mark.parametrize(
    "rows",
    ["a 48-byte token", "45 bytes: no padding window of the widest filter", "zeros after the end of word"],
)
def test_no_cut_when_a_token_has_no_padding_window(rows, randomize, to_char_ids, conv_widths):
    layer = make_cnn(randomize)
    padding_window_dominant(layer)
    if rows == "a 48-byte token":
        ids = to_char_ids([["ab", "z" * 70]])
    elif rows.startswith("45 bytes"):
        ids = to_char_ids([["ab", "y" * (50 - WIDEST - 1)]])  # 45 + 2 > 50 - 3: the widest filter has no such window
    else:
        ids = to_char_ids([["ab", "cd"]])
        ids[0, 1, 4:] = 0  # a caller's own ids: no padding chars after the token
    out = np.asarray(layer(ids))
    assert set(conv_widths) == {50}, conv_widths
    np.testing.assert_allclose(out, numpy_char_cnn(ids, layer), atol=1e-5, rtol=0)


def test_cut_gives_the_gradients_of_all_positions(randomize, to_char_ids):
    layer = make_cnn(randomize)
    padding_window_dominant(layer)
    flat = to_char_ids([["a", "to", "word", "longest", "a"]])[0]
    flat = np.concatenate([flat, np.zeros([2, 50], np.int32)])  # all-zero rows too, as encode_distinct has
    target = tf.constant(np.random.default_rng(0).normal(size=(len(flat), 6)), tf.float32)
    grads = []
    for encode in (layer.encode_tokens, lambda ids: full_width_tokens(layer, ids)):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(encode(tf.constant(flat)) * target)
        grads.append(tape.gradient(loss, layer.trainable_weights))
    for var, ours, full in zip(layer.trainable_weights, *grads):
        np.testing.assert_allclose(
            np.asarray(tf.convert_to_tensor(ours)),
            np.asarray(tf.convert_to_tensor(full)),
            atol=1e-4,
            rtol=1e-5,
            err_msg=var.path,
        )
    assert np.abs(np.asarray(tf.convert_to_tensor(grads[0][0]))[PAD]).max() > 0  # the padding window got its share


# --- each distinct token once (CharCNN.encode_distinct) ---

REPEATS = [["the", "cat", "the", "<S>", "cat", "the"], ["the", "a"], [], ["a", "z" * 70, "the"]]


@pytest.fixture
def encoded_rows(monkeypatch):
    """Records how many tokens each `CharCNN.encode_tokens` call encodes."""
    rows, encode_tokens = [], CharCNN.encode_tokens

    def spy(self, char_ids):
        rows.append(int(char_ids.shape[0]))
        return encode_tokens(self, char_ids)

    monkeypatch.setattr(CharCNN, "encode_tokens", spy)
    return rows


def test_encode_distinct_equals_call_in_values_and_gradients(randomize, to_char_ids):
    layer = make_cnn(randomize)
    ids = tf.constant(to_char_ids(REPEATS))
    target = tf.constant(np.random.default_rng(1).normal(size=(*ids.shape[:2], 6)), tf.float32)
    with tf.GradientTape(persistent=True) as tape:
        every, distinct = layer(ids), layer.encode_distinct(ids)
        loss_every, loss_distinct = tf.reduce_sum(every * target), tf.reduce_sum(distinct * target)
    np.testing.assert_allclose(np.asarray(distinct), np.asarray(every), atol=1e-6, rtol=0)
    np.testing.assert_allclose(np.asarray(distinct), numpy_char_cnn(ids.numpy(), layer), atol=1e-5, rtol=0)
    assert not np.asarray(distinct)[~ids.numpy().any(axis=-1)].any()  # padding rows are exactly zero
    weights = layer.trainable_weights
    for var, a, b in zip(weights, tape.gradient(loss_every, weights), tape.gradient(loss_distinct, weights)):
        a, b = np.asarray(tf.convert_to_tensor(a)), np.asarray(tf.convert_to_tensor(b))
        np.testing.assert_allclose(b, a, atol=1e-5, rtol=1e-5, err_msg=var.path)
        assert np.abs(a).max() > 0, var.path
    # any leading shape: flat tokens (n, 50), or one more axis
    flat = ids.numpy().reshape(-1, 50)
    np.testing.assert_allclose(np.asarray(layer.encode_distinct(flat)), np.asarray(every).reshape(-1, 6), atol=1e-6)
    np.testing.assert_allclose(np.asarray(layer.encode_distinct(ids[None]))[0], np.asarray(every), atol=1e-6)
    assert layer.encode_distinct(np.zeros([0, 0, 50], np.int32)).shape == (0, 0, 6)


def test_encode_distinct_encodes_each_distinct_token_once(randomize, to_char_ids, encoded_rows):
    layer = make_cnn(randomize)
    ids = to_char_ids(REPEATS)
    layer(ids)
    layer.encode_distinct(ids)
    real = sum(len(s) for s in REPEATS)
    distinct = len({t for s in REPEATS for t in s}) + 1  # and the all-zero row of padding
    assert encoded_rows == [real, distinct] == [11, 6]
