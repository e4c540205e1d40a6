"""elmo_tf/pretraining/step.py: `clip_and_average`, the training step's gradient clipping, against
`tf.clip_by_global_norm` followed by the division by the replica count (what the step did before), with dense and
sparse gradients, below and above the bound, and with a non-finite norm."""

import numpy as np
import pytest
import tensorflow as tf

from elmo_tf.pretraining import clip_and_average


def gradients(scale):
    rng = np.random.default_rng(0)
    dense = [tf.constant(rng.normal(size=s).astype(np.float32) * scale) for s in [(5, 3), (7,)]]
    sparse = tf.IndexedSlices(
        tf.constant(rng.normal(size=(4, 3)).astype(np.float32) * scale), tf.constant([0, 2, 2, 5]), tf.constant([6, 3])
    )
    return dense + [sparse]


def reference(grads, clip, replicas):
    clipped, _ = tf.clip_by_global_norm(grads, clip)
    return [
        tf.IndexedSlices(g.values / replicas, g.indices, g.dense_shape)
        if isinstance(g, tf.IndexedSlices)
        else g / replicas
        for g in clipped
    ]


def as_arrays(grads):
    return [
        (g.values.numpy(), g.indices.numpy()) if isinstance(g, tf.IndexedSlices) else (g.numpy(), None) for g in grads
    ]


@pytest.mark.parametrize("scale", [0.1, 30.0], ids=["norm-below-clip", "norm-above-clip"])
@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_equals_clip_by_global_norm_divided_by_the_replicas(scale, replicas):
    grads = gradients(scale)
    norm = float(tf.linalg.global_norm(grads))
    assert (norm < 10.0) == (scale < 1.0)  # each case is on the side of the bound it says
    ours = as_arrays(tf.function(lambda gs: clip_and_average(gs, 10.0, replicas))(grads))
    expected = as_arrays(reference(grads, 10.0, replicas))
    for (a, ai), (b, bi) in zip(ours, expected):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=0)
        if bi is not None:
            np.testing.assert_array_equal(ai, bi)
    clipped_norm = float(tf.linalg.global_norm([tf.constant(a) for a, _ in ours])) * replicas
    assert clipped_norm == pytest.approx(min(norm, 10.0), rel=1e-5)


@pytest.mark.parametrize("replicas", [1, 2])
@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_a_non_finite_norm_makes_every_gradient_nan(bad, replicas):
    """As `tf.clip_by_global_norm`: the optimizer then sees NaN, and the Trainer's checkpoints refuse it."""
    grads = gradients(1.0)
    grads[0] = tf.tensor_scatter_nd_update(grads[0], [[0, 0]], [bad])
    out = as_arrays(clip_and_average(grads, 10.0, replicas))
    for values, _ in out:
        assert np.isnan(values).all()
