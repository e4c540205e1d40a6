"""elmo_tf/models/bilm_pretrainer.py: `sampled_softmax_loss` against `tf.nn.sampled_softmax_loss` (values and
gradients, with the same negatives), with accidental hits and with large logits."""

import numpy as np
import pytest
import tensorflow as tf

from elmo_tf.models.bilm_pretrainer import sampled_softmax_loss


def losses_and_gradients(loss_fn, weights, biases, labels, inputs, num_sampled, num_classes, sampled_values):
    variables = [weights, biases, inputs]
    with tf.GradientTape() as tape:
        tape.watch(variables)
        loss = loss_fn(
            weights=weights,
            biases=biases,
            labels=labels,
            inputs=inputs,
            num_sampled=num_sampled,
            num_classes=num_classes,
            sampled_values=sampled_values,
        )
        total = tf.reduce_sum(loss * tf.linspace(0.5, 2.0, tf.shape(loss)[0]))  # unequal weights per row
    return loss.numpy(), [tf.convert_to_tensor(g).numpy() for g in tape.gradient(total, variables)]


@pytest.mark.parametrize(
    "num_classes, num_sampled, scale",
    [(50, 10, 1.0), (12, 8, 1.0), (1000, 64, 1.0), (50, 10, 40.0)],
    ids=["some-hits", "many-hits", "few-hits", "large-logits"],
)
def test_matches_tf_nn_sampled_softmax_loss(num_classes, num_sampled, scale):
    rng = np.random.default_rng(num_classes + num_sampled)
    targets, dim = 37, 16
    weights = tf.constant(rng.normal(size=(num_classes, dim)).astype(np.float32) * scale)
    biases = tf.constant(rng.normal(size=num_classes).astype(np.float32))
    labels = tf.constant(rng.integers(0, num_classes, size=(targets, 1)), tf.int64)
    inputs = tf.constant(rng.normal(size=(targets, dim)).astype(np.float32))
    sampled_values = tf.random.log_uniform_candidate_sampler(labels, 1, num_sampled, True, num_classes, seed=7)
    hits = tf.nn.compute_accidental_hits(labels, sampled_values[0], num_true=1)[0]
    if num_classes < 100:
        assert hits.shape[0] > 0  # the case removes accidental hits
    args = (weights, biases, labels, inputs, num_sampled, num_classes, sampled_values)
    ours, ours_grads = losses_and_gradients(sampled_softmax_loss, *args)
    ref, ref_grads = losses_and_gradients(tf.nn.sampled_softmax_loss, *args)
    assert np.isfinite(ours).all() and ours.min() >= 0  # 0.0 in float32 where the target outscores all by ~100
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5 * scale)
    for name, a, b in zip(("weights", "biases", "inputs"), ours_grads, ref_grads):
        assert np.isfinite(a).all(), name
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(b).max()), err_msg=name)
    assert np.abs(ref_grads[0]).max() > 1e-3


def test_an_accidental_hit_gets_no_probability():
    """A row whose target is also a sampled negative: that negative's logit is removed (its gradient is zero) and
    the loss is the one over the other negatives."""
    num_classes, dim = 6, 4
    rng = np.random.default_rng(0)
    weights = tf.constant(rng.normal(size=(num_classes, dim)).astype(np.float32))
    biases = tf.zeros([num_classes])
    inputs = tf.constant(rng.normal(size=(1, dim)).astype(np.float32))
    labels = tf.constant([[2]], tf.int64)
    sampled = tf.constant([2, 4], tf.int64)
    sampled_values = (sampled, tf.constant([[0.5]]), tf.constant([0.5, 0.25]))
    with tf.GradientTape() as tape:
        tape.watch(weights)
        loss = sampled_softmax_loss(weights, biases, labels, inputs, 2, num_classes, sampled_values=sampled_values)
    x, w = inputs.numpy()[0], weights.numpy()
    t, s = x @ w[2] - np.log(0.5), x @ w[4] - np.log(0.25)
    np.testing.assert_allclose(loss.numpy()[0], np.logaddexp(t, s) - t, rtol=1e-6)
    grad = tf.convert_to_tensor(tape.gradient(loss, weights)).numpy()
    p_s = np.exp(s - np.logaddexp(t, s))
    np.testing.assert_allclose(grad[4], p_s * x, rtol=1e-5)
    np.testing.assert_allclose(grad[2], (np.exp(t - np.logaddexp(t, s)) - 1) * x, rtol=1e-5)  # the target's term alone
    assert not grad[[0, 1, 3, 5]].any()
