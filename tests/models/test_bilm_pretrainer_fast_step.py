"""A training step of the fast path (hand-written LSTM backward pass) against the plain path (TF's automatic
gradient): same loss, gradients and updated weights. Both encode each distinct token once
(`CharCNN.encode_distinct`, tested against the char CNN on every position in tests/layers/test_char_cnn.py)."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from tiny_models import TINY

from elmo_tf.config import BiLMConfig
from elmo_tf.models import bilm_pretrainer
from elmo_tf.models.bilm_pretrainer import BiLMPretrainer
from elmo_tf.pretraining import TrainConfig, make_optimizer

VOCAB = 40


def _batch(seed, rows=5, length=9):
    rng = np.random.default_rng(seed)
    words = rng.integers(1, 30, size=(12, 50)).astype(np.int32)  # 12 distinct words, repeated in the batch
    words[:, 6:] = 0
    picks = rng.integers(0, 12, size=(rows, length))
    chars = words[picks]
    lengths = np.array([length, 3, 7, 1, 5])[:rows]
    for r, n in enumerate(lengths):
        chars[r, n:] = 0
    token_ids = np.where(np.arange(length)[None] < lengths[:, None], 3 + picks, 0).astype(np.int32)
    return {"char_ids": tf.constant(chars), "token_ids": tf.constant(token_ids)}


def _model(fast, **kwargs):
    keras.utils.set_random_seed(7)
    implementation = "auto" if fast else "scan"
    return BiLMPretrainer(
        BiLMConfig(**TINY), VOCAB, dropout=0.0, num_sampled=10, implementation=implementation, **kwargs
    )


def _step(model, batch, sampled):
    with tf.GradientTape() as tape:
        fwd, bwd, count = model.losses_sum(batch, training=True, sampled=sampled)
        loss = 0.5 * (fwd + bwd) / count
    variables = model.trainable_variables
    grads = tape.gradient(loss, variables)
    return float(loss), [tf.convert_to_tensor(g).numpy() for g in grads], variables, grads


@pytest.mark.parametrize("seed", [1, 2])
def test_a_training_step_of_the_fast_path_matches_the_plain_path(seed):
    """Full softmax (the sampled one draws random negatives); one Adagrad update from each."""
    batch = _batch(seed)
    fast, plain = _model(True), _model(False)
    loss_fast, grads_fast, vars_fast, raw_fast = _step(fast, batch, sampled=False)
    loss_plain, grads_plain, vars_plain, raw_plain = _step(plain, batch, sampled=False)
    assert loss_fast == pytest.approx(loss_plain, rel=1e-6)
    assert len(grads_fast) == len(grads_plain)
    for v, a, b in zip(vars_fast, grads_plain, grads_fast):
        scale = max(1e-3, float(np.abs(a).max()))
        np.testing.assert_allclose(b, a, atol=2e-5 * scale, err_msg=v.path)
    assert max(float(np.abs(g).max()) for g in grads_plain) > 1e-3  # the comparison is not of zeros
    for raw, variables in ((raw_fast, vars_fast), (raw_plain, vars_plain)):
        optimizer = make_optimizer(TrainConfig(steps=1))
        optimizer.apply_gradients(zip(raw, variables))
    for a, b in zip(vars_plain, vars_fast):
        np.testing.assert_allclose(b.numpy(), a.numpy(), atol=1e-5, err_msg=a.path)


def test_the_fast_path_is_the_training_default_and_differs_from_the_plain_path_in_speed_only():
    """The switch really selects another code path: its graph holds the hand-written gradient's loops."""
    batch = _batch(3)

    def graph_ops(fast):
        model = _model(fast)

        @tf.function
        def step(batch):
            with tf.GradientTape() as tape:
                fwd, _, _ = model.losses_sum(batch, training=True, sampled=False)
            return tape.gradient(fwd, model.trainable_variables)

        return {op.type for op in step.get_concrete_function(batch).graph.get_operations()}

    assert BiLMPretrainer(BiLMConfig(**TINY), VOCAB).implementation == "auto"
    assert "IdentityN" in graph_ops(True)  # tf.custom_gradient's marker
    assert "IdentityN" not in graph_ops(False)


def test_one_sampled_softmax_serves_both_directions(monkeypatch):
    """One `sampled_softmax_loss` call over the forward targets, then the backward ones; the sums are split at
    the right row (a fake loss of 1 per forward row and 1000 per backward row shows any misplaced row)."""
    model = _model(True)
    batch = _batch(1)
    out = model(batch, training=True)
    n_targets = int(tf.reduce_sum(out["weights"]))
    calls = []

    def fake(weights, biases, labels, inputs, num_sampled, num_classes, **kwargs):
        calls.append((labels.numpy()[:, 0], int(inputs.shape[0]), num_sampled, num_classes))
        return tf.concat([tf.ones([n_targets]), tf.fill([n_targets], 1000.0)], axis=0) + 0.0 * inputs[:, 0]

    monkeypatch.setattr(bilm_pretrainer, "sampled_softmax_loss", fake)
    fwd, bwd, count = model.losses_sum(batch, training=True)
    assert len(calls) == 1
    labels, rows, num_sampled, num_classes = calls[0]
    assert rows == 2 * n_targets and (num_sampled, num_classes) == (10, VOCAB)
    _, targets_f = model._flatten(out, "forward")
    _, targets_b = model._flatten(out, "backward")
    np.testing.assert_array_equal(labels, np.concatenate([targets_f.numpy(), targets_b.numpy()]))
    assert (float(fwd), float(bwd), float(count)) == (n_targets, 1000.0 * n_targets, n_targets)


def test_a_training_step_with_bfloat16_matmuls_stays_close_to_float32():
    """`matmul_dtype="bfloat16"` (TrainConfig.matmul_precision): the LSTM and sampled-softmax products in bfloat16,
    the rest float32; one step's loss and gradients within bfloat16 rounding of the float32 step's, on the same
    sampled negatives (same seed)."""
    batch = _batch(4)
    results = []
    for dtype in (None, "bfloat16"):
        model = _model(True, matmul_dtype=dtype)
        tf.random.set_seed(11)  # the same negatives for both
        results.append(_step(model, batch, sampled=True))
    (loss_exact, grads_exact, variables, _), (loss_low, grads_low, _, _) = results
    assert loss_low == pytest.approx(loss_exact, rel=2e-2)
    assert loss_low != loss_exact
    for v, a, b in zip(variables, grads_exact, grads_low):
        assert b.dtype == np.float32, v.path
        np.testing.assert_allclose(b, a, atol=5e-2 * max(1e-3, float(np.abs(a).max())), err_msg=v.path)


def test_evaluation_runs_float32_whatever_the_matmul_dtype():
    batch = _batch(5)
    exact, low = _model(True), _model(True, matmul_dtype="bfloat16")
    a = exact.losses_sum(batch, training=False, sampled=False)
    b = low.losses_sum(batch, training=False, sampled=False)
    assert [float(t) for t in a] == [float(t) for t in b]


def test_bilm_names_a_bad_matmul_dtype():
    with pytest.raises(ValueError, match=r"matmul_dtype must be one of \(None, 'float32', 'bfloat16'\), got 'float16'"):
        _model(True, matmul_dtype="float16")


def test_the_loop_and_matmul_dtype_are_saved_constructor_arguments_not_settable_attributes():
    """As `keras.layers.LSTM(use_cudnn=)`: chosen when the model is made, saved by get_config, passed down to the BiLM;
    nothing switches them on a built model from outside."""
    model = _model(False, matmul_dtype="float32")
    config = model.get_config()
    assert (config["implementation"], config["matmul_dtype"]) == ("scan", "float32")
    assert (model.bilm.implementation, model.bilm.matmul_dtype) == ("scan", "float32")
    clone = BiLMPretrainer.from_config(dict(config, implementation="auto", matmul_dtype="bfloat16"))
    assert (clone.implementation, clone.matmul_dtype) == ("auto", "bfloat16")
    assert (clone.bilm.implementation, clone.bilm.matmul_dtype) == ("auto", "bfloat16")
    for name, value in (("matmul_dtype", "bfloat16"), ("implementation", "auto")):
        with pytest.raises(AttributeError):
            setattr(model, name, value)
    assert not hasattr(model, "fast_gradient")
