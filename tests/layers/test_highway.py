"""elmo_tf/layers/highway.py: y = g * relu(x Wt + bt) + (1 - g) * x, g = sigmoid(x Wc + bc)."""

import numpy as np
import pytest
from layer_testlib import same_mask

from elmo_tf.layers import Highway


def numpy_highway(x, layer):
    x = np.asarray(x, np.float64)
    for k in range(layer.num_layers):
        w_c, b_c = layer.carry_kernels[k].numpy(), layer.carry_biases[k].numpy()
        w_t, b_t = layer.transform_kernels[k].numpy(), layer.transform_biases[k].numpy()
        g = 1.0 / (1.0 + np.exp(-(x @ w_c + b_c)))
        x = g * np.maximum(x @ w_t + b_t, 0.0) + (1.0 - g) * x
    return x


@pytest.mark.parametrize("num_layers", [1, 2, 3])
@pytest.mark.parametrize("shape", [(7, 6), (3, 5, 6)])
def test_matches_numpy(num_layers, shape, randomize):
    layer = Highway(num_layers)
    layer.build(shape)
    randomize(layer, seed=num_layers, scale=0.7)
    x = np.random.default_rng(1).normal(size=shape).astype(np.float32)
    out = np.asarray(layer(x))
    assert out.shape == shape and out.dtype == np.float32
    np.testing.assert_allclose(out, numpy_highway(x, layer), atol=1e-5, rtol=0)
    assert not np.allclose(out, x, atol=1e-3)  # the layer does something


def test_gate_is_the_carry_weight_on_the_nonlinear_branch():
    """bilm-tf's W_carry/b_carry gate the relu branch: gate 1 -> relu(x Wt + bt), gate 0 -> x."""
    layer = Highway(1)
    layer.build((None, 4))
    rng = np.random.default_rng(0)
    layer.transform_kernels[0].assign(rng.normal(size=(4, 4)).astype(np.float32))
    layer.transform_biases[0].assign(rng.normal(size=(4,)).astype(np.float32))
    layer.carry_kernels[0].assign(np.zeros((4, 4), np.float32))
    x = rng.normal(size=(5, 4)).astype(np.float32)
    relu_branch = np.maximum(x @ layer.transform_kernels[0].numpy() + layer.transform_biases[0].numpy(), 0)
    layer.carry_biases[0].assign(np.full((4,), 50.0, np.float32))
    np.testing.assert_allclose(np.asarray(layer(x)), relu_branch, atol=1e-5)
    layer.carry_biases[0].assign(np.full((4,), -50.0, np.float32))
    np.testing.assert_allclose(np.asarray(layer(x)), x, atol=1e-5)


def test_zero_layers_is_identity():
    x = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    layer = Highway(0)
    np.testing.assert_array_equal(np.asarray(layer(x)), x)
    assert layer.weights == []


def test_validation():
    with pytest.raises(ValueError, match="num_layers"):
        Highway(-1)
    with pytest.raises(ValueError, match="last dimension"):
        Highway(1).build((None, None))


@pytest.mark.parametrize(
    "num_layers,shape,precision",
    [(2, (4, 6), "float32"), (1, (3, 5, 6), "float32"), (0, (2, 3), "float32"), (2, (3, 5, 6), "bfloat16")],
    ids=["2d", "masked", "none", "masked-bfloat16"],
)
def test_layer_contract(num_layers, shape, precision, layer_contract):
    """Config, shapes, the mask passed through, `.keras` reload in another process (tests/layer_testlib.py)."""
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    mask = np.arange(shape[1])[None] < np.array([[5], [2], [0]]) if len(shape) == 3 else None
    init = dict(num_layers=num_layers, name="hw", precision=precision)
    layer, _ = layer_contract(Highway, init, x, mask=mask, output_mask=same_mask)
    assert layer.get_config()["precision"] == layer.precision == precision
