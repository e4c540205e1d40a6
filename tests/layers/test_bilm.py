"""elmo_tf/layers/bilm.py: separate forward/backward projected-LSTM stacks, residuals, masking, state."""

import numpy as np
import pytest
import tensorflow as tf
from layer_testlib import same_mask

from elmo_tf.layers import BiLM, ProjectedLSTM, ProjectedLSTMCell

LAYERS, UNITS, PROJ = 2, 12, 6
DIRECTIONS = ("forward", "backward")


def make_bilm(randomize, skip=True, seed=0, **kwargs):
    layer = BiLM(LAYERS, UNITS, PROJ, cell_clip=3.0, proj_clip=3.0, use_skip_connections=skip, **kwargs)
    layer.build((None, None, PROJ))
    randomize(layer, seed=seed, scale=0.4)
    return layer


def make_inputs(lengths, steps=None, seed=0):
    steps = max(lengths) if steps is None else steps
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(len(lengths), steps, PROJ)).astype(np.float32)
    mask = np.arange(steps)[None, :] < np.array(lengths)[:, None]
    return x, mask


def numpy_bilm(x, lengths, bilm, numpy_lstm, initial_state=None):
    """Reference biLM from the step-by-step LSTM reference: per direction a stack of cells, layer l>0
    adds its input (residual); outputs forward ++ backward, zeros at padding."""
    mask = (np.arange(x.shape[1])[None, :] < np.array(lengths)[:, None])[:, :, None]
    stream = {d: np.asarray(x, np.float64) for d in DIRECTIONS}
    outputs, finals = [], {}
    for layer in range(bilm.num_layers):
        new = {}
        for k, d in enumerate(DIRECTIONS):
            c0 = h0 = None
            if initial_state is not None:
                i = (k * bilm.num_layers + layer) * 2  # documented order: [c, h] fwd layers, then bwd layers
                c0, h0 = initial_state[i], initial_state[i + 1]
            cell = bilm.get_lstm(d, layer)
            out, c, h = numpy_lstm(stream[d], lengths, cell, go_backwards=d == "backward", initial_c=c0, initial_h=h0)
            finals[d, layer] = [c, h]
            new[d] = out + stream[d] if bilm.use_skip_connections and layer > 0 else out
        stream = new
        outputs.append(np.concatenate([stream["forward"], stream["backward"]], axis=-1) * mask)
    return outputs, [s for d in DIRECTIONS for layer in range(bilm.num_layers) for s in finals[d, layer]]


@pytest.mark.parametrize("skip", [True, False], ids=["skip", "no-skip"])
def test_matches_numpy_reference(skip, randomize, numpy_lstm):
    bilm = make_bilm(randomize, skip=skip)
    lengths = [5, 2, 0, 4]
    x, mask = make_inputs(lengths)
    outputs, states = bilm(x, mask=mask, return_state=True)
    ref, ref_states = numpy_bilm(x, lengths, bilm, numpy_lstm)
    assert len(outputs) == LAYERS and len(states) == 4 * LAYERS
    for layer, (out, expected) in enumerate(zip(outputs, ref)):
        assert out.shape == (4, 5, 2 * PROJ)
        np.testing.assert_allclose(np.asarray(out), expected, atol=1e-5, rtol=0, err_msg=f"layer {layer}")
        np.testing.assert_array_equal(np.asarray(out)[~mask], 0.0)
    for k, (state, expected) in enumerate(zip(states, ref_states)):
        np.testing.assert_allclose(np.asarray(state), expected, atol=1e-5, rtol=0, err_msg=f"state {k}")


def test_initial_state_order(randomize, numpy_lstm):
    """initial_state is [c, h] of forward layer 0, 1, ..., then backward layer 0, 1, ..."""
    bilm = make_bilm(randomize)
    lengths = [4, 3]
    x, mask = make_inputs(lengths)
    rng = np.random.default_rng(3)
    state = [
        rng.normal(scale=0.5, size=(2, UNITS if i % 2 == 0 else PROJ)).astype(np.float32) for i in range(4 * LAYERS)
    ]
    outputs, final = bilm(x, mask=mask, initial_state=[tf.constant(s) for s in state], return_state=True)
    ref, ref_final = numpy_bilm(x, lengths, bilm, numpy_lstm, initial_state=state)
    for out, expected in zip(outputs, ref):
        np.testing.assert_allclose(np.asarray(out), expected, atol=1e-5, rtol=0)
    for s, expected in zip(final, ref_final):
        np.testing.assert_allclose(np.asarray(s), expected, atol=1e-5, rtol=0)
    zero_outputs = bilm(x, mask=mask)
    assert np.abs(np.asarray(zero_outputs[0]) - np.asarray(outputs[0])).max() > 1e-3


@pytest.mark.parametrize("skip", [True, False], ids=["skip", "no-skip"])
def test_padding_invariance_and_batch_independence(skip, randomize):
    bilm = make_bilm(randomize, skip=skip)
    rng = np.random.default_rng(7)
    sentence = rng.normal(size=(1, 4, PROJ)).astype(np.float32)
    alone = [np.asarray(o) for o in bilm(sentence)]
    # batched with much longer sentences, extra padding (holding noise) after it, at row 1
    lengths = [23, 4, 17, 30]
    x, mask = make_inputs(lengths, steps=32, seed=8)
    x[1, :4] = sentence[0]
    batched = [np.asarray(o) for o in bilm(x, mask=mask)]
    for layer in range(LAYERS):
        np.testing.assert_allclose(batched[layer][1, :4], alone[layer][0], atol=1e-5, rtol=0)
        assert not batched[layer][1, 4:].any()


@pytest.mark.parametrize("skip", [True, False], ids=["skip", "no-skip"])
def test_directions_read_only_their_side(skip, randomize):
    """Forward outputs at t < k ignore tokens >= k; backward outputs at t >= k ignore tokens < k."""
    bilm = make_bilm(randomize, skip=skip)
    lengths, k = [8, 6], 3
    x, mask = make_inputs(lengths)
    base = [np.asarray(o) for o in bilm(x, mask=mask)]
    later = x.copy()
    later[:, k:] += 1.0
    changed_later = [np.asarray(o) for o in bilm(later, mask=mask)]
    earlier = x.copy()
    earlier[:, :k] += 1.0
    changed_earlier = [np.asarray(o) for o in bilm(earlier, mask=mask)]
    for layer in range(LAYERS):
        fwd, bwd = slice(0, PROJ), slice(PROJ, 2 * PROJ)
        np.testing.assert_allclose(changed_later[layer][:, :k, fwd], base[layer][:, :k, fwd], atol=1e-6, rtol=0)
        np.testing.assert_allclose(changed_earlier[layer][:, k:, bwd], base[layer][:, k:, bwd], atol=1e-6, rtol=0)
        # and each half does depend on its own side
        assert np.abs(changed_later[layer][:, k:, fwd] - base[layer][:, k:, fwd]).max() > 1e-3
        assert np.abs(changed_later[layer][:, :k, bwd] - base[layer][:, :k, bwd]).max() > 1e-3
        assert np.abs(changed_earlier[layer][:, :k, fwd] - base[layer][:, :k, fwd]).max() > 1e-3


def test_forward_state_round_trip(randomize):
    """Running a sequence in two halves with the carried state equals running it whole (forward half).

    Only the forward direction continues: the backward LM reads right to left, so its whole-sequence
    outputs for the first half depend on tokens of the second half that the first call never sees, and
    the backward state after the first call is the state after that half's *first* token, not a state
    from which the second half (read from its own end) could continue.
    """
    bilm = make_bilm(randomize)
    lengths, k = [10, 7, 2, 10], 4  # row 2 ends inside the first half
    x, mask = make_inputs(lengths)
    whole = [np.asarray(o) for o in bilm(x, mask=mask)]
    first, state = bilm(x[:, :k], mask=mask[:, :k], return_state=True)
    second = bilm(x[:, k:], mask=mask[:, k:], initial_state=state)
    for layer in range(LAYERS):
        np.testing.assert_allclose(np.asarray(first[layer])[:, :, :PROJ], whole[layer][:, :k, :PROJ], atol=1e-5, rtol=0)
        np.testing.assert_allclose(
            np.asarray(second[layer])[:, :, :PROJ], whole[layer][:, k:, :PROJ], atol=1e-5, rtol=0
        )
    # without the carried state the second half differs: the check above can fail
    fresh = bilm(x[:, k:], mask=mask[:, k:])
    assert np.abs(np.asarray(fresh[0])[:, :, :PROJ] - whole[0][:, k:, :PROJ]).max() > 1e-3


def test_errors(randomize):
    bilm = make_bilm(randomize)
    x, mask = make_inputs([3, 2])
    state = bilm.zero_state(2)
    assert len(state) == 4 * LAYERS
    with pytest.raises(ValueError, match=f"{4 * LAYERS}"):
        bilm(x, mask=mask, initial_state=state[:-1])
    with pytest.raises(ValueError, match="projection_dim"):
        BiLM(LAYERS, UNITS, PROJ).build((None, None, PROJ + 1))
    with pytest.raises(ValueError, match="num_layers"):
        BiLM(0, UNITS, PROJ)
    with pytest.raises(ValueError, match="direction"):
        bilm.get_lstm("sideways", 0)


def test_sublayer_names(randomize):
    bilm = make_bilm(randomize)
    assert [bilm.get_lstm(d, k).name for d in DIRECTIONS for k in range(LAYERS)] == [
        "forward_lstm_0",
        "forward_lstm_1",
        "backward_lstm_0",
        "backward_lstm_1",
    ]
    assert all(isinstance(bilm.get_lstm(d, k), ProjectedLSTMCell) for d in DIRECTIONS for k in range(LAYERS))
    # the weight converter and saved optimizer slots rely on these variable paths
    assert [v.path.split("/", 1)[1] for v in bilm.weights[:4]] == [
        "forward_lstm_0/input_kernel",
        "forward_lstm_0/recurrent_kernel",
        "forward_lstm_0/bias",
        "forward_lstm_0/projection_kernel",
    ]
    assert [v.path.split("/", 1)[1] for v in bilm.weights[8:][:1]] == ["backward_lstm_0/input_kernel"]


def test_dropout_only_in_training(randomize):
    bilm = make_bilm(randomize, dropout=0.5)
    x, mask = make_inputs([4, 3])
    inference = np.asarray(bilm(x, mask=mask)[1])
    np.testing.assert_array_equal(np.asarray(bilm(x, mask=mask, training=False)[1]), inference)
    assert np.abs(np.asarray(bilm(x, mask=mask, training=True)[1]) - inference).max() > 1e-3


@pytest.mark.parametrize(
    "skip, implementation, extra",
    [
        (True, "auto", {}),
        (False, "auto", dict(dropout=0.1)),
        (True, "scan", {}),
        (False, "fast_gradient", dict(cell_clip=None, proj_clip=None)),
        (True, "auto", dict(precision="bfloat16")),
    ],
    ids=["skip-auto", "no-skip-auto-dropout", "skip-scan", "no-skip-fast_gradient-no-clip", "skip-auto-bfloat16"],
)
def test_layer_contract(skip, implementation, extra, layer_contract):
    """Config (implementation included), shapes, the mask passed through to every layer's output, padding (1e3 at
    absent positions) and longer batch-mates, `.keras` reload in another process (tests/layer_testlib.py). In
    inference "auto" runs the plain scan and "fast_gradient" the hand-written loop."""
    init = dict(
        num_layers=LAYERS,
        units=UNITS,
        projection_dim=PROJ,
        cell_clip=3.0,
        proj_clip=3.0,
        use_skip_connections=skip,
        implementation=implementation,
    )
    init.update(extra)
    x, mask = make_inputs([5, 2, 0, 4])
    mates, mates_mask = make_inputs([8, 7], seed=3)
    layer, outputs = layer_contract(
        BiLM,
        init,
        x,
        mask=mask,
        output_mask=same_mask,
        pad_value=1e3,
        batch_mates=mates * 10.0,
        batch_mates_mask=mates_mask,
    )
    assert layer.get_config()["implementation"] == implementation
    assert layer.get_config()["precision"] == extra.get("precision", "float32") == layer.precision
    assert len(outputs) == LAYERS and all(out.shape == (4, 5, 2 * PROJ) for out in outputs)
    assert all(np.abs(out[mask]).max() > 1e-2 for out in outputs)  # the comparisons are not of zeros


@pytest.mark.parametrize("skip", [True, False])
def test_packed_segments_equal_each_sequence_alone(skip, randomize):
    """Rows holding several sequences back to back (`segment_starts`) give each sequence exactly the outputs it
    gets alone, in both directions; trailing padding after the last segment changes nothing."""
    bilm = make_bilm(randomize, skip)
    lengths = [[3, 5, 1], [7], [2, 2, 2, 2], [4, 1]]
    steps = max(sum(row) for row in lengths) + 2  # padding at the end of every row
    x, _ = make_inputs([steps] * len(lengths), seed=3)
    mask = np.zeros([len(lengths), steps], bool)
    starts = np.zeros([len(lengths), steps], bool)
    for r, row in enumerate(lengths):
        at = 0
        for n in row:
            starts[r, at] = True
            at += n
        mask[r, :at] = True
    packed = [np.asarray(o) for o in bilm(x, mask=mask, segment_starts=starts)]
    worst = 0.0
    for r, row in enumerate(lengths):
        at = 0
        for n in row:
            alone = bilm(x[r : r + 1, at : at + n])
            for layer in range(LAYERS):
                worst = max(worst, np.abs(packed[layer][r, at : at + n] - np.asarray(alone[layer])[0]).max())
            at += n
        for layer in range(LAYERS):
            assert not packed[layer][r, at:].any()  # padding stays zero
    assert worst < 1e-6
    # without the segment starts the same rows give other outputs: the test can tell
    plain = np.asarray(bilm(x, mask=mask)[-1])
    assert np.abs(plain - packed[-1]).max() > 1e-3


@pytest.mark.parametrize("chunk", [1, 3, 4, 100])
def test_gate_chunks_change_nothing(chunk, randomize):
    bilm = make_bilm(randomize)
    x, mask = make_inputs([9, 4, 1, 7], seed=5)
    whole = bilm(x, mask=mask)
    chunked = bilm(x, mask=mask, gate_chunk=chunk)
    for a, b in zip(whole, chunked):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-6, rtol=0)


@pytest.mark.parametrize("chunk", [None, 3])
def test_stacked_and_per_direction_recurrences_agree(chunk, randomize):
    """Small kernels advance both directions as one stacked tensor, large ones one matmul per direction: both
    give the same outputs and final states, with segment resets too."""
    from elmo_tf.layers.backends import tensorflow_recurrence as recurrence

    bilm = make_bilm(randomize)
    lstms = [bilm.get_lstm(d, 0) for d in DIRECTIONS]
    x, mask = make_inputs([9, 4, 1, 7], seed=7)
    x_tm = tf.transpose(tf.constant(x), [1, 0, 2])
    mask_tm = tf.transpose(tf.constant(mask))
    resets = tf.transpose(tf.constant(np.arange(9)[None, :] % 3 == 0) & tf.constant(mask))
    rng = np.random.default_rng(1)
    c0 = [tf.constant(rng.normal(size=(4, UNITS)), tf.float32) for _ in DIRECTIONS]
    h0 = [tf.constant(rng.normal(size=(4, PROJ)), tf.float32) for _ in DIRECTIONS]
    w_x, bias, w_h, w_p = zip(*(lstm.kernels() for lstm in lstms))
    results = []
    assert recurrence.stack_directions(UNITS, PROJ) and not recurrence.stack_directions(4096, 512)
    for stacked in (True, False):
        results.append(
            recurrence.projected_lstm_scan.python_function(
                [x_tm, x_tm[::-1]],
                mask_tm,
                list(w_x),
                list(bias),
                list(w_h),
                list(w_p),
                c0,
                h0,
                3.0,
                3.0,
                resets=[resets, resets],
                chunk=chunk,
                stack_directions=stacked,
            )
        )
    for a, b in zip(*results):
        for u, v in zip(a, b):
            np.testing.assert_allclose(np.asarray(u), np.asarray(v), atol=1e-6, rtol=0)
    assert np.abs(np.asarray(results[0][0][0])).max() > 0.01


def test_implementation_and_matmul_dtype_are_saved_constructor_arguments(randomize):
    """The loop is chosen as `keras.layers.LSTM(use_cudnn=)` chooses its own: constructor arguments that get_config
    saves; bad values are refused when the layer is made, naming the argument and the value."""
    bilm = make_bilm(randomize, implementation="scan")
    config = bilm.get_config()
    assert (config["implementation"], config["matmul_dtype"]) == ("scan", None)
    clone = BiLM.from_config(dict(config, implementation="fast_gradient", matmul_dtype="bfloat16"))
    assert (clone.implementation, clone.matmul_dtype) == ("fast_gradient", "bfloat16")
    assert (BiLM(LAYERS, UNITS, PROJ).implementation, BiLM(LAYERS, UNITS, PROJ).matmul_dtype) == ("auto", None)
    with pytest.raises(
        ValueError, match=r"implementation must be one of \('auto', 'scan', 'fast_gradient', 'ops'\), got 'cudnn'"
    ):
        BiLM(LAYERS, UNITS, PROJ, implementation="cudnn")
    with pytest.raises(ValueError, match=r"matmul_dtype must be one of \(None, 'float32', 'bfloat16'\), got 'float16'"):
        BiLM(LAYERS, UNITS, PROJ, matmul_dtype="float16")
    with pytest.raises(
        ValueError, match="matmul_dtype 'bfloat16' needs implementation 'auto', 'fast_gradient' or 'ops'"
    ):
        BiLM(LAYERS, UNITS, PROJ, implementation="scan", matmul_dtype="bfloat16")
    x, mask = make_inputs([3, 2])
    with pytest.raises(ValueError, match="gate_chunk needs implementation 'auto' or 'scan', got gate_chunk=2"):
        make_bilm(randomize, implementation="fast_gradient")(x, mask=mask, gate_chunk=2)
    with pytest.raises(
        ValueError, match="gate_chunk needs implementation 'auto' or 'scan', got gate_chunk=2 with 'ops'"
    ):
        make_bilm(randomize, implementation="ops")(x, mask=mask, gate_chunk=2)


@pytest.mark.parametrize(
    "implementation, training, hand_written",
    [
        ("auto", True, True),
        ("auto", False, False),
        ("scan", True, False),
        ("fast_gradient", False, True),
        ("ops", True, False),
        ("ops", False, False),
    ],
)
def test_implementation_selects_the_loop_with_the_same_values(implementation, training, hand_written, randomize):
    """ "auto" runs the hand-written backward pass in training only, "scan" never, "fast_gradient" always (its graph
    holds tf.custom_gradient's IdentityN), "ops" never (the keras.ops loop of JAX and PyTorch, here on TensorFlow);
    every choice gives the plain scan's outputs and gradients."""
    x, mask = make_inputs([6, 3, 5], seed=2)
    x = tf.constant(x)
    weights = tf.constant(np.random.default_rng(4).normal(size=(3, 6, 2 * PROJ)), tf.float32)

    def run(bilm, training):
        @tf.function
        def step(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                loss = sum(tf.reduce_sum(out * weights) for out in bilm(x, mask=mask, training=training))
            return loss, tape.gradient(loss, [x] + bilm.trainable_variables)

        ops = {op.type for op in step.get_concrete_function(x).graph.get_operations()}
        return [np.asarray(t) for t in tf.nest.flatten(step(x))], ops

    values, ops = run(make_bilm(randomize, implementation=implementation), training)
    reference, reference_ops = run(make_bilm(randomize, implementation="scan"), training)
    assert ("IdentityN" in ops) == hand_written and "IdentityN" not in reference_ops
    for got, want in zip(values, reference):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(want).max())))
    assert float(np.abs(reference[1]).max()) > 1e-2  # the comparison is not of zeros


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_projected_lstm_runs_the_same_loop_as_a_bilm_layer(direction, randomize):
    """A `ProjectedLSTM` with a BiLM cell's weights (and `go_backwards` for the backward one) gives that direction's
    layer-0 outputs of the BiLM (no residual at layer 0): one loop, one reading order."""
    bilm = make_bilm(randomize)
    cell = bilm.get_lstm(direction, 0)
    lstm = ProjectedLSTM(UNITS, PROJ, cell_clip=3.0, proj_clip=3.0, go_backwards=direction == "backward")
    lstm.build((None, None, PROJ))
    lstm.set_weights(cell.get_weights())
    x, mask = make_inputs([7, 2, 5, 1], seed=9)
    half = slice(0, PROJ) if direction == "forward" else slice(PROJ, 2 * PROJ)
    expected = np.asarray(bilm(x, mask=mask)[0])[:, :, half]
    np.testing.assert_allclose(np.asarray(lstm(x, mask=mask)), expected, atol=1e-6, rtol=0)
    other = "backward" if direction == "forward" else "forward"
    lstm.set_weights(bilm.get_lstm(other, 0).get_weights())
    assert np.abs(np.asarray(lstm(x, mask=mask)) - expected).max() > 1e-3  # the check above can fail
