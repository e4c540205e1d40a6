"""elmo_tf/layers/projected_lstm.py: TF1 LSTMCell(num_proj) with clipping, forward and backward, masked."""

import inspect
import json

import keras
import numpy as np
import pytest
import tensorflow as tf
from layer_testlib import rewrite_keras_weights, same_mask

from elmo_tf.layers import ProjectedLSTM, ProjectedLSTMCell
from elmo_tf.layers.projected_lstm import CELL_ARGUMENTS

UNITS, PROJ, DIM = 6, 4, 5
LENGTHS = [7, 3, 0, 5, 1]  # includes an empty row and a full row


def make_lstm(randomize, seed=0, scale=0.6, **kwargs):
    kwargs.setdefault("cell_clip", 0.8)
    kwargs.setdefault("proj_clip", 0.5)
    layer = ProjectedLSTM(UNITS, PROJ, **kwargs)
    layer.build((None, None, DIM))
    randomize(layer, seed=seed, scale=scale)
    return layer


def make_inputs(lengths=LENGTHS, steps=7, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(len(lengths), steps, DIM)).astype(np.float32)  # padding holds noise too
    mask = np.arange(steps)[None, :] < np.array(lengths)[:, None]
    return x, mask


@pytest.mark.parametrize("go_backwards", [False, True], ids=["forward", "backward"])
def test_matches_step_by_step_numpy(go_backwards, randomize, numpy_lstm):
    layer = make_lstm(randomize, go_backwards=go_backwards, return_state=True)
    x, mask = make_inputs()
    out, (c, h) = layer(x, mask=mask)
    ref, ref_c, ref_h = numpy_lstm(x, LENGTHS, layer)
    assert out.shape == (5, 7, PROJ) and c.shape == (5, UNITS) and h.shape == (5, PROJ)
    np.testing.assert_allclose(np.asarray(out), ref, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(np.asarray(out)[~mask], 0.0)  # masked steps give exact zeros
    # final state: after each row's last real token (for backward: after its first token)
    np.testing.assert_allclose(np.asarray(c), ref_c, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(h), ref_h, atol=1e-5, rtol=0)
    np.testing.assert_allclose(
        np.asarray(h)[[0, 1, 3, 4]], ref[[0, 1, 3, 4], 0 if go_backwards else [6, 2, 4, 0]], atol=1e-5
    )
    # the empty row keeps its (zero) initial state
    assert not np.asarray(c)[2].any() and not np.asarray(h)[2].any()


def test_clipping_and_forget_bias_matter(randomize, numpy_lstm):
    """The reference test above can only fail on clipping/forget-bias errors if they change the numbers."""
    layer = make_lstm(randomize)
    x, _ = make_inputs()
    ref, ref_c, _ = numpy_lstm(x, LENGTHS, layer)
    unclipped, unclipped_c, _ = numpy_lstm(x, LENGTHS, layer, cell_clip=None, proj_clip=None)
    assert np.isclose(np.abs(ref_c).max(), 0.8) and np.abs(unclipped_c).max() > 0.85
    assert np.isclose(np.abs(ref).max(), 0.5) and np.abs(unclipped - ref).max() > 1e-2


def test_no_clipping(randomize, numpy_lstm):
    layer = make_lstm(randomize, cell_clip=None, proj_clip=None)
    x, mask = make_inputs()
    ref, _, _ = numpy_lstm(x, LENGTHS, layer)
    np.testing.assert_allclose(np.asarray(layer(x, mask=mask)), ref, atol=1e-5, rtol=0)


def test_without_mask_every_step_is_real(randomize, numpy_lstm):
    layer = make_lstm(randomize)
    x, _ = make_inputs()
    ref, _, _ = numpy_lstm(x, [7] * 5, layer)
    np.testing.assert_allclose(np.asarray(layer(x)), ref, atol=1e-5, rtol=0)


def test_backward_reads_each_row_from_its_last_real_token(randomize):
    """go_backwards equals the forward cell run on each row reversed by its own length, re-reversed."""
    forward = make_lstm(randomize, go_backwards=False)
    backward = make_lstm(randomize, go_backwards=True)
    backward.set_weights(forward.get_weights())
    x, mask = make_inputs()
    x_rev = np.zeros_like(x)
    for b, n in enumerate(LENGTHS):
        x_rev[b, :n] = x[b, :n][::-1]
    fwd_on_rev = np.asarray(forward(x_rev, mask=mask))
    expected = np.zeros_like(fwd_on_rev)
    for b, n in enumerate(LENGTHS):
        expected[b, :n] = fwd_on_rev[b, :n][::-1]
    np.testing.assert_allclose(np.asarray(backward(x, mask=mask)), expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("go_backwards", [False, True], ids=["forward", "backward"])
def test_initial_state_is_used(go_backwards, randomize, numpy_lstm):
    layer = make_lstm(randomize, go_backwards=go_backwards, return_state=True)
    x, mask = make_inputs()
    rng = np.random.default_rng(5)
    c0 = rng.normal(scale=0.5, size=(5, UNITS)).astype(np.float32)
    h0 = rng.normal(scale=0.5, size=(5, PROJ)).astype(np.float32)
    out, (c, h) = layer(x, mask=mask, initial_state=[tf.constant(c0), tf.constant(h0)])
    ref, ref_c, ref_h = numpy_lstm(x, LENGTHS, layer, initial_c=c0, initial_h=h0)
    np.testing.assert_allclose(np.asarray(out), ref, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(c), ref_c, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(h), ref_h, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(c)[2], c0[2], atol=0)  # empty row: state passes through
    zero_out, _ = layer(x, mask=mask)
    assert np.abs(np.asarray(zero_out) - np.asarray(out)).max() > 1e-3


def test_padding_invariance(randomize):
    layer = make_lstm(randomize, go_backwards=True)
    x, mask = make_inputs()
    alone = np.asarray(layer(x[1:2, :3]))
    padded = np.asarray(layer(x, mask=mask))[1:2, :3]
    np.testing.assert_allclose(padded, alone, atol=1e-6, rtol=0)


def test_dropout_only_in_training(randomize):
    layer = make_lstm(randomize, dropout=0.5)
    x, mask = make_inputs()
    inference = np.asarray(layer(x, mask=mask))
    np.testing.assert_array_equal(np.asarray(layer(x, mask=mask, training=False)), inference)
    trained = np.asarray(layer(x, mask=mask, training=True))
    assert np.abs(trained - inference).max() > 1e-3
    np.testing.assert_array_equal(trained[~mask], 0.0)


def test_weight_shapes_and_validation(randomize):
    layer = make_lstm(randomize)
    assert tuple(layer.input_kernel.shape) == (4 * UNITS, DIM)  # stored transposed: the step's orientation
    assert tuple(layer.recurrent_kernel.shape) == (4 * UNITS, PROJ)
    assert tuple(layer.bias.shape) == (4 * UNITS,)
    assert tuple(layer.projection_kernel.shape) == (PROJ, UNITS)
    with pytest.raises(ValueError, match="units"):
        ProjectedLSTM(0, 4)
    with pytest.raises(ValueError, match="cell_clip"):
        ProjectedLSTM(4, 4, cell_clip=-1.0)
    with pytest.raises(ValueError, match="dropout"):
        ProjectedLSTM(4, 4, dropout=1.0)
    with pytest.raises(ValueError, match="float"):
        layer(np.zeros((2, 3), np.float32))


@pytest.mark.parametrize(
    "extra",
    [
        dict(),
        dict(go_backwards=True),
        dict(cell_clip=0.8, proj_clip=0.5),
        dict(go_backwards=True, cell_clip=0.8, proj_clip=0.5, dropout=0.25, implementation="scan"),
        dict(go_backwards=True, implementation="fast_gradient"),
    ],
    ids=["forward", "backward", "clipped", "backward-clipped-dropout-scan", "backward-fast_gradient"],
)
def test_layer_contract(extra, layer_contract, numpy_lstm):
    """Config, shapes, the mask passed through, padding (1e3 at absent positions) and longer batch-mates, `.keras`
    reload in another process (tests/layer_testlib.py); the outputs with the test's weights are the reference's."""
    x, mask = make_inputs()
    mates, mates_mask = make_inputs([9, 8], steps=9, seed=1)
    layer, out = layer_contract(
        ProjectedLSTM,
        dict(units=UNITS, projection_dim=PROJ, **extra),
        x,
        mask=mask,
        output_mask=same_mask,
        pad_value=1e3,
        batch_mates=mates,
        batch_mates_mask=mates_mask,
        weight_scale=0.6,
    )
    ref, _, _ = numpy_lstm(x, LENGTHS, layer)
    np.testing.assert_allclose(out, ref, atol=1e-5, rtol=0)
    assert np.abs(ref).max() > 0.1
    if "proj_clip" in extra:  # the clip is reached, so the contract ran with clipping in effect
        assert np.isclose(np.abs(out).max(), extra["proj_clip"])


@pytest.mark.parametrize("go_backwards", [False, True], ids=["forward", "backward"])
def test_layer_contract_with_return_state(go_backwards, layer_contract):
    """With `return_state` the outputs `(out, [c, h])` carry no mask (`compute_mask` gives None); the final states of
    a row do not depend on padding after it or on its batch-mates."""
    x, mask = make_inputs()
    mates, mates_mask = make_inputs([9, 8], steps=9, seed=1)
    _, (out, (c, h)) = layer_contract(
        ProjectedLSTM,
        dict(
            units=UNITS, projection_dim=PROJ, cell_clip=0.8, proj_clip=0.5, go_backwards=go_backwards, return_state=True
        ),
        x,
        mask=mask,
        output_mask=None,
        pad_value=1e3,
        batch_mates=mates,
        batch_mates_mask=mates_mask,
        zeros_at_padding=False,
        weight_scale=0.6,
    )
    assert out.shape == (5, 7, PROJ) and c.shape == (5, UNITS) and h.shape == (5, PROJ)
    np.testing.assert_array_equal(out[~mask], 0.0)  # what zeros_at_padding=False leaves unchecked in the contract
    assert np.abs(c).max() > 0.1


def test_the_cell_steps_under_keras_rnn_as_the_layer_runs(randomize, numpy_lstm):
    """`ProjectedLSTMCell.call` is one step in the Keras cell convention: `keras.layers.RNN(cell)` (Keras's own loop,
    step by step) gives the layer's outputs and final state, and the NumPy reference's."""
    layer = make_lstm(randomize, return_state=True)
    cell = layer.cell
    assert (cell.state_size, cell.output_size) == ([UNITS, PROJ], PROJ)
    rnn = keras.layers.RNN(cell, return_sequences=True, return_state=True, zero_output_for_mask=True)
    x, mask = make_inputs()
    out, c, h = rnn(x, mask=mask)
    want, (want_c, want_h) = layer(x, mask=mask)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), atol=1e-6, rtol=0)
    np.testing.assert_allclose(np.asarray(c), np.asarray(want_c), atol=1e-6, rtol=0)
    np.testing.assert_allclose(np.asarray(h), np.asarray(want_h), atol=1e-6, rtol=0)
    ref, ref_c, _ = numpy_lstm(x, LENGTHS, layer)
    np.testing.assert_allclose(np.asarray(out), ref, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(c), ref_c, atol=1e-5, rtol=0)
    assert [v.path for v in layer.weights] == [
        f"{layer.name}/projected_lstm_cell/{name}"
        for name in ("input_kernel", "recurrent_kernel", "bias", "projection_kernel")
    ]


def test_cell_contract_under_keras_rnn(fresh_process, randomize):
    """The cell's part of the layer contract where `run_layer_test` cannot call it (a Keras cell's `call` takes
    `states`): its config is JSON, names every `__init__` argument and survives `from_config` and Keras's
    serialize / deserialize by its registered name; `keras.layers.RNN(cell)` in a functional model, saved to `.keras`,
    reloads in the other process of the contract (tests/layer_testlib.py) with the same outputs, states and config."""
    init = dict(units=UNITS, projection_dim=PROJ, cell_clip=0.8, proj_clip=0.5, dropout=0.25)
    cell = ProjectedLSTMCell(**init)
    config = cell.get_config()
    assert {k: config[k] for k in init} == init and json.loads(json.dumps(config)) == config
    assert keras.saving.get_registered_name(ProjectedLSTMCell) == "elmo_tf>ProjectedLSTMCell"
    assert ProjectedLSTMCell.from_config(config).get_config() == config
    revived = keras.saving.deserialize_keras_object(json.loads(json.dumps(keras.saving.serialize_keras_object(cell))))
    assert type(revived) is ProjectedLSTMCell and revived.get_config() == config
    rnn = keras.layers.RNN(cell, return_sequences=True, return_state=True, zero_output_for_mask=True)
    inputs, mask_input = keras.Input((None, DIM)), keras.Input((None,), dtype="bool")
    model = keras.Model([inputs, mask_input], rnn(inputs, mask=mask_input))
    randomize(model, seed=2, scale=0.6)
    x, mask = make_inputs()
    out, c, _ = (np.asarray(t) for t in model([x, mask]))
    assert np.abs(out[mask]).max() > 0.1 and np.abs(c).max() > 0.1  # the reload compares more than zeros
    fresh_process.check(model, [x, mask], rnn.name)


def test_the_layer_saves_the_cell_arguments_as_the_cell_does():
    """One list of the cell's arguments (`CELL_ARGUMENTS`, every argument of `ProjectedLSTMCell.__init__`) feeds both
    configs: the layer's holds the values its cell's holds, and rebuilds the same cell."""
    cell_arguments = set(inspect.signature(ProjectedLSTMCell.__init__).parameters) - {"self", "kwargs"}
    assert set(CELL_ARGUMENTS) == cell_arguments
    layer = ProjectedLSTM(UNITS, PROJ, cell_clip=0.8, proj_clip=0.5, dropout=0.25, go_backwards=True)
    config, cell_config = layer.get_config(), layer.cell.get_config()
    assert {k: config[k] for k in CELL_ARGUMENTS} == {k: cell_config[k] for k in CELL_ARGUMENTS}
    assert {k: cell_config[k] for k in CELL_ARGUMENTS} == dict(
        units=UNITS, projection_dim=PROJ, cell_clip=0.8, proj_clip=0.5, dropout=0.25, precision="float32"
    )
    rebuilt = ProjectedLSTM.from_config(config).cell.get_config()
    assert {k: rebuilt[k] for k in CELL_ARGUMENTS} == {k: cell_config[k] for k in CELL_ARGUMENTS}


def test_implementation_is_a_saved_constructor_argument(randomize):
    """The layer runs BiLM's loop and takes its `implementation`; "fast_gradient" gives the plain scan's values."""
    plain = make_lstm(randomize, go_backwards=True, implementation="scan")
    fast = ProjectedLSTM.from_config(dict(plain.get_config(), implementation="fast_gradient"))
    assert plain.get_config()["implementation"] == "scan" and fast.implementation == "fast_gradient"
    assert ProjectedLSTM(UNITS, PROJ).get_config()["matmul_dtype"] is None
    fast.build((None, None, DIM))
    fast.set_weights(plain.get_weights())
    x, mask = make_inputs()
    np.testing.assert_allclose(np.asarray(fast(x, mask=mask)), np.asarray(plain(x, mask=mask)), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="implementation must be one of"):
        ProjectedLSTM(UNITS, PROJ, implementation="cudnn")


def _before_the_cell(weights, names):
    """As the code before `ProjectedLSTMCell` wrote a .keras file: a `ProjectedLSTM`'s variables in its own group, not
    in its `cell` subgroup."""
    cells = [name for name in names if name.endswith("/cell")]
    assert len(cells) == 1
    group = weights[cells[0].rsplit("/", 1)[0]]
    del group["vars"]
    group.move("cell/vars", "vars")
    del group["cell"]


def test_keras_files_from_before_the_cell_still_load(randomize, tmp_path):
    inputs = keras.Input((None, DIM))
    model = keras.Model(inputs, ProjectedLSTM(UNITS, PROJ, cell_clip=0.8, go_backwards=True)(inputs))
    randomize(model, seed=3, scale=0.6)
    path, old = tmp_path / "lstm.keras", tmp_path / "old.keras"
    model.save(path)
    rewrite_keras_weights(path, old, _before_the_cell)
    x, _ = make_inputs()
    loaded = keras.saving.load_model(old)
    np.testing.assert_array_equal(np.asarray(loaded(x)), np.asarray(model(x)))
    np.testing.assert_array_equal(np.asarray(keras.saving.load_model(path)(x)), np.asarray(model(x)))
