"""elmo_tf/layers/low_precision.py: a layer's matmuls and convolutions in bfloat16 with float32 accumulation (the result
rounded to the nearest bfloat16 on every CPU, from a bfloat16 copy or from a loop's form), and the layers computing in
bfloat16 (`precision="bfloat16"`) against the same layers in float32."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_matmul_precision import _bf16, _check_rounded, _operands

from elmo_tf.layers import BiLM, CharCNN, Highway, ProjectedLSTM, low_precision
from elmo_tf.precision import PrecisionError, resolve_precision

# bfloat16 against float32, same weights: max |diff| over the float32 output's largest magnitude. Measured on the
# AVX2 EPYC (TF's bfloat16 matmul emulated with rounding to nearest, oneDNN's own bfloat16 convolution), these tests'
# weights and inputs: Highway 0.0035, ProjectedLSTM 0.0039, BiLM 0.0052 and 0.0055 (its two layers), CharCNN 0.0198
# (its 6 outputs are sums of 17 highway features that partly cancel). Rounding an operand to bfloat16 errs by up to
# 2^-9 relative, and each product is rounded once more.
LAYER_BOUND = 0.05


def _conv_reference(x, kernel):
    """VALID, stride-1 conv over axis 1 in float64: `(n, positions, c)`, `(width, c, f)` -> `(n, positions', f)`."""
    width = kernel.shape[0]
    steps = x.shape[1] - width + 1
    return np.stack([np.einsum("nwc,wcf->nf", x[:, p : p + width], kernel) for p in range(steps)], axis=1)


def test_matmul_rounds_to_nearest_from_a_copy_and_from_a_loop_form():
    """The product of the rounded operands, rounded to the nearest bfloat16, float32: from a layer's bfloat16 copy,
    from `loop_operand`'s form of it (float32 where this CPU's bfloat16 matmul is emulated) and of float32 weights."""
    a, b = _operands(seed=11)
    copy = tf.cast(b, tf.bfloat16)
    exact = _bf16(a) @ _bf16(b)
    results = []
    for w in (copy, low_precision.loop_operand(copy), low_precision.loop_operand(tf.constant(b))):
        out = low_precision.matmul(tf.constant(a), w)
        assert out.dtype == tf.float32
        _check_rounded(out.numpy(), exact)
        results.append(out.numpy())
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[1], results[2])


@pytest.mark.parametrize("emulate", [False, True], ids=["this-cpu", "emulated"])
def test_conv1d_rounds_to_nearest(emulate, monkeypatch):
    """As this CPU runs it (oneDNN's bfloat16 convolution rounds to nearest even on AVX2), and as the float32
    emulation runs it where a backend's does not."""
    if emulate:
        monkeypatch.setattr(low_precision, "emulated", lambda op: True)
    rng = np.random.default_rng(12)
    x = rng.normal(size=(5, 9, 4)).astype(np.float32)
    kernel = rng.normal(size=(3, 4, 6)).astype(np.float32)
    for operand in (tf.constant(x), tf.cast(x, tf.bfloat16)):
        out = low_precision.conv1d(operand, tf.cast(kernel, tf.bfloat16))
        assert out.dtype == tf.float32 and out.shape == (5, 7, 6)
        _check_rounded(out.numpy(), _conv_reference(_bf16(x), _bf16(kernel)))


def test_layer_precision_checks_the_value_and_resolves_auto():
    assert low_precision.layer_precision(None) == ("float32", "float32")
    assert low_precision.layer_precision("bfloat16") == ("bfloat16", "bfloat16")
    assert low_precision.layer_precision("auto") == ("auto", resolve_precision("auto"))
    for layer in (lambda p: Highway(1, precision=p), lambda p: CharCNN(precision=p), lambda p: BiLM(precision=p)):
        with pytest.raises(PrecisionError, match="precision must be one of float32, bfloat16, auto; got 'half'") as e:
            layer("half")
        assert e.value.key == "precision"


def test_bfloat16_biLM_refuses_a_float32_matmul_dtype():
    with pytest.raises(PrecisionError, match="matmul_dtype 'float32' contradicts precision 'bfloat16'"):
        BiLM(precision="bfloat16", matmul_dtype="float32")
    assert BiLM(precision="bfloat16", matmul_dtype="bfloat16").precision == "bfloat16"


def _pair(make, build_shape, randomize, seed=0, scale=0.5):
    """A float32 layer and the same layer computing in bfloat16 with its weights (set through `set_weights`, which
    marks the copies stale)."""
    plain = make("float32")
    plain.build(build_shape)
    randomize(plain, seed=seed, scale=scale)
    low = make("bfloat16")
    low.build(build_shape)
    low.set_weights(plain.get_weights())
    return plain, low


def _inputs(kind, to_char_ids):
    rng = np.random.default_rng(1)
    if kind == "char_cnn":
        return (to_char_ids([["The", "cat", "sat", "."], ["Hello", "wörld"]]),), {}
    x = rng.normal(size=(3, 6, 8)).astype(np.float32)
    mask = np.arange(6)[None] < np.array([[6], [3], [5]])
    return (x,), ({} if kind == "highway" else {"mask": mask})


LAYERS = {
    "highway": (lambda p: Highway(2, precision=p), (None, 8)),
    "char_cnn": (lambda p: CharCNN(((1, 4), (2, 8), (3, 5)), 2, 6, 3, precision=p), (None, None, 50)),
    "projected_lstm": (lambda p: ProjectedLSTM(16, 8, cell_clip=3.0, proj_clip=3.0, precision=p), (None, None, 8)),
    "bilm": (lambda p: BiLM(2, 16, 8, precision=p), (None, None, 8)),
}


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_bfloat16_layers_stay_within_bfloat16_error_of_float32(kind, randomize, to_char_ids):
    """Same weights, same inputs: every output within LAYER_BOUND of float32's scale, float32, and not equal to it
    (the bfloat16 path really runs)."""
    make, shape = LAYERS[kind]
    plain, low = _pair(make, shape, randomize)
    args, kwargs = _inputs(kind, to_char_ids)
    want, got = plain(*args, **kwargs), low(*args, **kwargs)
    want, got = (want, got) if isinstance(want, list) else ([want], [got])
    for w, g in zip(want, got):
        w, g = keras.ops.convert_to_numpy(w), keras.ops.convert_to_numpy(g)
        assert g.dtype == np.float32
        scale = np.abs(w).max()
        assert scale > 0.1
        assert 0 < np.abs(g - w).max() <= LAYER_BOUND * scale, (np.abs(g - w).max(), scale)
    assert low.get_config()["precision"] == "bfloat16" and plain.get_config()["precision"] == "float32"


def test_a_layer_from_its_config_computes_what_it_was_asked(randomize):
    """ "auto" is kept as asked in the config and resolved in the attribute; a config without the key (written before
    the setting existed) is float32."""
    layer = Highway(1, precision="auto")
    assert layer.get_config()["precision"] == "auto" and layer.precision == resolve_precision("auto")
    old = {k: v for k, v in Highway(1).get_config().items() if k != "precision"}
    assert Highway.from_config(old).precision == "float32"
    lstm = ProjectedLSTM(4, 2, precision="auto")
    assert lstm.get_config()["precision"] == "auto" and lstm.cell.get_config()["precision"] == "auto"
