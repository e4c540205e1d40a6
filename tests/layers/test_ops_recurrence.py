"""elmo_tf/layers/ops_recurrence.py: the keras.ops loop of JAX and PyTorch, here on TensorFlow, against TensorFlow's
own loop (`recurrence.projected_lstm_scan`) and its automatic gradient: initial states, clips, resets (packed
segments), padding. tests/backends/ runs the layers on it under JAX and PyTorch."""

import numpy as np
import pytest
import tensorflow as tf
from test_tensorflow_recurrence import _problem, _value_and_grads

from elmo_tf.layers.backends.tensorflow_recurrence import projected_lstm_scan
from elmo_tf.layers.ops_recurrence import ops_lstm_scan, reverse_by_lengths


@pytest.mark.parametrize("clips", [(None, None), (0.5, 0.3)])
@pytest.mark.parametrize("with_resets", [False, True])
def test_values_and_gradients_equal_tensorflows_loop(clips, with_resets):
    """Outputs, final states and every input's gradient (inputs, kernels, biases, initial states) within 1e-5."""
    args, mask, resets, weights = _problem(seed=3)
    resets = resets if with_resets else None
    want_values, want_grads = _value_and_grads(projected_lstm_scan, args, mask, resets, weights, clips)
    got_values, got_grads = _value_and_grads(ops_lstm_scan, args, mask, resets, weights, clips)
    for got, want in zip(got_values, want_values):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for got, want in zip(got_grads, want_grads):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(want).max())))
    assert max(float(np.abs(g).max()) for g in want_grads) > 0.1  # the comparison is not of zeros


def test_reverse_by_lengths_is_reverse_sequence():
    """Each column's first `length` steps reversed, the rest in place (lengths 0 and the full time included)."""
    x = np.random.default_rng(0).normal(size=(6, 4, 3)).astype(np.float32)
    lengths = np.array([6, 0, 3, 1], np.int32)
    want = tf.reverse_sequence(x, lengths, seq_axis=0, batch_axis=1).numpy()
    np.testing.assert_array_equal(np.asarray(reverse_by_lengths(x, lengths)), want)
    np.testing.assert_array_equal(np.asarray(reverse_by_lengths(x[:, :, 0], lengths)), want[:, :, 0])
