"""elmo_tf/layers/scalar_mix.py: gamma * sum_k softmax(w)_k h_k, optional per-sentence layer norm."""

import keras
import numpy as np
import pytest
from layer_testlib import same_mask

from elmo_tf.layers import ScalarMix

NUM, DIM = 3, 5


def make_inputs(lengths, steps=None, seed=0):
    steps = max(lengths) if steps is None else steps
    rng = np.random.default_rng(seed)
    # layers on very different scales/offsets, so normalization and weighting both matter
    hs = [(rng.normal(size=(len(lengths), steps, DIM)) * (k + 1) * 2 + k).astype(np.float32) for k in range(NUM)]
    mask = np.arange(steps)[None, :] < np.array(lengths)[:, None]
    return hs, mask


def numpy_mix(hs, mask, weights, gamma, layer_norm=False, eps=1e-12):
    w = np.exp(weights - np.max(weights))
    w = w / w.sum()
    m = mask[:, :, None].astype(np.float64)
    total = 0.0
    for k, h in enumerate(hs):
        h = np.asarray(h, np.float64)
        if layer_norm:  # per sentence, over its real tokens and all features
            normed = np.zeros_like(h)
            for b in range(h.shape[0]):
                real = h[b][mask[b]]
                if real.size:
                    normed[b] = (h[b] - real.mean()) / np.sqrt(real.var() + eps)
            h = normed
        total = total + w[k] * h
    return gamma * total * m


@pytest.mark.parametrize("layer_norm", [False, True], ids=["plain", "layer-norm"])
def test_matches_numpy(layer_norm):
    weights, gamma = np.array([0.3, -1.2, 0.8]), 1.7
    mix = ScalarMix(NUM, layer_norm=layer_norm, initial_weights=list(weights), initial_gamma=gamma)
    hs, mask = make_inputs([4, 2, 1, 0])
    out = np.asarray(mix(hs, mask=mask))
    assert out.shape == (4, 4, DIM)
    np.testing.assert_allclose(out, numpy_mix(hs, mask, weights, gamma, layer_norm), atol=1e-5, rtol=1e-6)
    np.testing.assert_array_equal(out[~mask], 0.0)


def test_defaults_are_the_plain_average_and_no_mask_means_all_real():
    hs, _ = make_inputs([3, 3])
    out = np.asarray(ScalarMix(NUM)(hs))
    np.testing.assert_allclose(out, np.mean(np.stack(hs), axis=0), atol=1e-5, rtol=0)


def test_layer_norm_is_per_sentence_and_ignores_padding():
    mix = ScalarMix(NUM, layer_norm=True, initial_weights=[0.1, 0.5, -0.3])
    hs, mask = make_inputs([3], steps=3, seed=1)
    alone = np.asarray(mix(hs, mask=mask))
    # batched with a sentence on a very different scale, with extra padding holding large values
    others, _ = make_inputs([6], steps=6, seed=2)
    batched = []
    for h, other in zip(hs, others):
        row = np.full((1, 6, DIM), 1e3, np.float32)
        row[0, :3] = h[0]
        batched.append(np.concatenate([row, other * 100.0 + 50.0]))
    batch_mask = np.array([[True] * 3 + [False] * 3, [True] * 6])
    out = np.asarray(mix(batched, mask=batch_mask))
    np.testing.assert_allclose(out[0, :3], alone[0], atol=1e-5, rtol=0)
    np.testing.assert_array_equal(out[0, 3:], 0.0)


def test_l2_coef_adds_the_regularization_loss():
    weights, l2 = [0.5, -1.0, 2.0], 0.01
    mix = ScalarMix(NUM, initial_weights=weights, l2_coef=l2)
    hs, mask = make_inputs([2, 1])
    mix(hs, mask=mask)
    mix(hs, mask=mask)  # a second call replaces the loss, it does not accumulate
    assert len(mix.losses) == 1
    np.testing.assert_allclose(float(mix.losses[0]), l2 * np.sum(np.square(weights)), rtol=1e-6)
    plain = ScalarMix(NUM, initial_weights=weights)
    plain(hs, mask=mask)
    assert plain.losses == []
    # in a functional model the loss appears in model.losses
    inputs = [keras.Input((None, DIM)) for _ in range(NUM)]
    model = keras.Model(inputs, ScalarMix(NUM, initial_weights=weights, l2_coef=l2)(inputs))
    model(hs)
    assert len(model.losses) == 1
    np.testing.assert_allclose(float(model.losses[0]), l2 * np.sum(np.square(weights)), rtol=1e-6)


def test_fixed_weights_are_not_trainable():
    mix = ScalarMix(NUM, initial_weights=[0.0, 0.0, 5.0], weights_trainable=False)
    hs, mask = make_inputs([2, 2])
    mix(hs, mask=mask)
    assert mix.scalar_weights.trainable is False
    assert [v.name for v in mix.trainable_weights] == ["gamma"]
    assert [v.name for v in mix.non_trainable_weights] == ["scalar_weights"]
    frozen = ScalarMix(NUM, weights_trainable=False, trainable_gamma=False)
    frozen(hs, mask=mask)
    assert frozen.trainable_weights == []
    # a training step leaves fixed weights unchanged and moves gamma
    inputs = [keras.Input((None, DIM)) for _ in range(NUM)]
    model = keras.Model(inputs, mix(inputs))
    model.compile(keras.optimizers.SGD(0.1), "mse")
    model.fit(hs, np.ones_like(hs[0]), epochs=1, verbose=0)
    np.testing.assert_array_equal(mix.scalar_weights.numpy(), [0.0, 0.0, 5.0])
    assert float(mix.gamma.numpy()) != 1.0


def test_wrong_inputs_raise_value_error():
    mix = ScalarMix(NUM)
    hs, mask = make_inputs([2, 1])
    with pytest.raises(ValueError, match="num_layers=3"):
        mix(hs[:2], mask=mask)
    with pytest.raises(ValueError, match="num_layers=3"):
        mix(hs + hs[:1], mask=mask)
    with pytest.raises(ValueError, match="num_layers"):
        ScalarMix(NUM, initial_weights=[0.0, 1.0])
    with pytest.raises(ValueError, match="num_layers"):
        ScalarMix(0)
    with pytest.raises(ValueError, match="l2_coef"):
        ScalarMix(NUM, l2_coef=-1.0)


@pytest.mark.parametrize(
    "init",
    [
        dict(num_layers=NUM),
        dict(
            num_layers=NUM,
            layer_norm=True,
            initial_weights=[0.1, 0.2, 0.3],
            weights_trainable=False,
            initial_gamma=0.5,
            trainable_gamma=False,
            l2_coef=0.001,
        ),
    ],
    ids=["defaults", "every-option"],
)
def test_layer_contract(init, layer_contract):
    """Config, shapes, the mask passed through, padding (garbage at masked positions) and batch-mates, `.keras`
    reload in another process (tests/layer_testlib.py)."""
    hs, mask = make_inputs([4, 2, 1, 0])
    mates, mates_mask = make_inputs([6, 5], seed=2)
    layer_contract(
        ScalarMix,
        init,
        hs,
        mask=mask,
        output_mask=same_mask,
        pad_value=1e3,
        batch_mates=[h * 100.0 + 50.0 for h in mates],
        batch_mates_mask=mates_mask,
    )


def test_layer_contract_without_a_mask(layer_contract):
    """No mask: every position is real, and the output carries no mask."""
    hs, _ = make_inputs([3, 3])
    layer_contract(ScalarMix, dict(num_layers=NUM, layer_norm=True), hs, output_mask=same_mask)
