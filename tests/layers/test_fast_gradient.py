"""The training scan's hand-written backward pass (`fast_gradient_scan`) against TensorFlow's automatic
gradient of the plain scan (`projected_lstm_scan`)."""

import numpy as np
import pytest
import tensorflow as tf

from elmo_tf.layers.recurrence import fast_gradient_scan, projected_lstm_scan


def _problem(seed, steps=7, batch=5, dim=6, units=8, proj=4, num=2, lengths=(7, 3, 5, 1, 0)):
    rng = np.random.default_rng(seed)
    mask = np.arange(steps)[:, None] < np.array(lengths)[None, :]
    args = dict(
        inputs=[tf.constant(rng.normal(size=(steps, batch, dim)), tf.float32) for _ in range(num)],
        input_kernels=[tf.constant(rng.normal(size=(4 * units, dim)), tf.float32) for _ in range(num)],
        biases=[tf.constant(rng.normal(size=(4 * units,)), tf.float32) for _ in range(num)],
        recurrent_kernels=[tf.constant(rng.normal(size=(4 * units, proj)), tf.float32) for _ in range(num)],
        projection_kernels=[tf.constant(rng.normal(size=(proj, units)), tf.float32) for _ in range(num)],
        initial_c=[tf.constant(rng.normal(size=(batch, units)), tf.float32) for _ in range(num)],
        initial_h=[tf.constant(rng.normal(size=(batch, proj)), tf.float32) for _ in range(num)],
    )
    resets = [tf.constant(mask & (rng.random(mask.shape) < 0.25)) for _ in range(num)]
    weights = [
        [tf.constant(rng.normal(size=(steps, batch, proj)), tf.float32) for _ in range(num)],
        [tf.constant(rng.normal(size=(batch, units)), tf.float32) for _ in range(num)],
        [tf.constant(rng.normal(size=(batch, proj)), tf.float32) for _ in range(num)],
    ]
    return args, tf.constant(mask), resets, weights


def _value_and_grads(scan, args, mask, resets, weights, clips, **kwargs):
    sources = [t for name in sorted(args) for t in args[name]]
    with tf.GradientTape() as tape:
        tape.watch(sources)
        outs, cs, hs = scan(mask=mask, resets=resets, cell_clip=clips[0], proj_clip=clips[1], **args, **kwargs)
        loss = sum(tf.reduce_sum(y * w) for group, ws in zip((outs, cs, hs), weights) for y, w in zip(group, ws))
    return [t.numpy() for t in outs + cs + hs], [g.numpy() for g in tape.gradient(loss, sources)]


@pytest.mark.parametrize("clips", [(None, None), (0.5, 0.3), (3.0, 3.0)])
@pytest.mark.parametrize("with_resets", [False, True])
def test_fast_gradient_equals_automatic_gradient(clips, with_resets):
    args, mask, resets, weights = _problem(seed=1)
    resets = resets if with_resets else None
    plain_values, plain_grads = _value_and_grads(projected_lstm_scan, args, mask, resets, weights, clips)
    fast_values, fast_grads = _value_and_grads(fast_gradient_scan, args, mask, resets, weights, clips)
    for plain, fast in zip(plain_values, fast_values):
        np.testing.assert_allclose(fast, plain, rtol=1e-5, atol=1e-5)  # the forget bias is added in another order
    for plain, fast in zip(plain_grads, fast_grads):
        scale = max(1.0, float(np.abs(plain).max()))
        np.testing.assert_allclose(fast, plain, rtol=1e-5, atol=1e-5 * scale)


def test_clipping_changes_the_gradient():
    """The clips reach the gradient (else the clipped cases above would test nothing beyond the unclipped)."""
    args, mask, _, weights = _problem(seed=2)
    _, free = _value_and_grads(fast_gradient_scan, args, mask, None, weights, (None, None))
    _, clipped = _value_and_grads(fast_gradient_scan, args, mask, None, weights, (0.5, 0.3))
    assert max(float(np.abs(a - b).max()) for a, b in zip(free, clipped)) > 1e-2


def test_one_direction_in_a_compiled_function():
    args, mask, _, weights = _problem(seed=3, num=1)
    expected_values, expected_grads = _value_and_grads(projected_lstm_scan, args, mask, None, weights, (3.0, 3.0))
    compiled = tf.function(fast_gradient_scan)
    values, grads = _value_and_grads(compiled, args, mask, None, weights, (3.0, 3.0))
    for a, b in zip(expected_values + expected_grads, values + grads):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(a).max())))
