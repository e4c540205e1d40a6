"""elmo_tf/pretraining/optimizers.py: the fused Adagrad and Adam against numpy, against Keras' own, sparse ==
dense, under a strategy, and through a checkpoint of Keras' optimizer."""

import contextlib

import keras
import numpy as np
import pytest
import tensorflow as tf

from elmo_tf.pretraining.distribute import get_strategy
from elmo_tf.pretraining.optimizers import FusedAdagrad, FusedAdam

SHAPES = [(7, 5), (11,), (3, 4, 2)]


def gradients(seed, steps):
    rng = np.random.default_rng(seed)
    return [[rng.normal(size=s).astype(np.float32) for s in SHAPES] for _ in range(steps)]


def run(make, grads, start, strategy=None):
    """The variables after applying `grads` (one list per step) from `start` with the optimizer `make()` returns,
    each step a compiled call."""
    with strategy.scope() if strategy else contextlib.nullcontext():
        optimizer = make()
        variables = [keras.Variable(w.copy()) for w in start]
        optimizer.build(variables)

    @tf.function
    def apply(gs):
        def replica(gs):
            # placed on the replica's device, as gradients computed in the replica are (the all-reduce needs one)
            optimizer.apply_gradients(zip([tf.identity(g) for g in gs], variables))

        if strategy:
            strategy.run(replica, args=(gs,))
        else:
            replica(gs)

    for gs in grads:
        apply([tf.constant(g) for g in gs])
    return [v.numpy() for v in variables]


def numpy_adagrad(grads, start, lr, initial, epsilon):
    ws, accs = [w.astype(np.float64) for w in start], [np.full(w.shape, initial) for w in start]
    for gs in grads:
        for w, acc, g in zip(ws, accs, gs):
            acc += g.astype(np.float64) ** 2
            w -= lr * g / (np.sqrt(acc) + epsilon)
    return ws


def numpy_adam(grads, start, lr, b1, b2, epsilon):
    ws = [w.astype(np.float64) for w in start]
    ms, vs = [np.zeros(w.shape) for w in start], [np.zeros(w.shape) for w in start]
    for t, gs in enumerate(grads, start=1):
        alpha = lr * np.sqrt(1 - b2**t) / (1 - b1**t)
        for w, m, v, g in zip(ws, ms, vs, gs):
            m += (g - m) * (1 - b1)
            v += (g.astype(np.float64) ** 2 - v) * (1 - b2)
            w -= alpha * m / (np.sqrt(v) + epsilon)
    return ws


@pytest.fixture
def start():
    rng = np.random.default_rng(0)
    return [rng.normal(size=s).astype(np.float32) for s in SHAPES]


def test_fused_adagrad_matches_numpy_and_keras(start):
    grads = gradients(1, 5)
    fused = run(lambda: FusedAdagrad(0.2, initial_accumulator_value=1.0, epsilon=1e-7), grads, start)
    reference = numpy_adagrad(grads, start, 0.2, 1.0, 1e-7)
    plain = run(lambda: keras.optimizers.Adagrad(0.2, initial_accumulator_value=1.0, epsilon=1e-7), grads, start)
    for f, r, p, w in zip(fused, reference, plain, start):
        np.testing.assert_allclose(f, r, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(f, p, rtol=1e-6, atol=1e-6)  # epsilon under vs after the root: < 1e-7 apart
        assert np.abs(f - w).min() > 1e-3  # every entry moved: the update ran


def test_fused_adam_matches_numpy_and_keras(start):
    grads = gradients(2, 5)
    fused = run(lambda: FusedAdam(0.01), grads, start)
    reference = numpy_adam(grads, start, 0.01, 0.9, 0.999, 1e-7)
    plain = run(lambda: keras.optimizers.Adam(0.01), grads, start)
    for f, r, p in zip(fused, reference, plain):
        np.testing.assert_allclose(f, r, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(f, p, rtol=1e-6, atol=1e-6)


def compiled_apply(optimizer, variable):
    @tf.function
    def apply(gradient):
        optimizer.apply_gradients([(gradient, variable)])

    return apply


def sparse_gradient_steps():
    """Three steps of gradients of a (6, 3) embedding: as IndexedSlices with repeated indices, and dense."""
    rng = np.random.default_rng(3)
    steps = []
    for indices in ([0, 0, 4], [2, 4, 4, 4, 1], [5]):
        values = rng.normal(size=(len(indices), 3)).astype(np.float32)
        dense = np.zeros((6, 3), np.float32)
        np.add.at(dense, indices, values)
        steps.append((tf.IndexedSlices(tf.constant(values), tf.constant(indices), tf.constant([6, 3])), dense))
    return steps


@pytest.mark.parametrize(
    "make", [lambda: FusedAdagrad(0.3, initial_accumulator_value=1.0), lambda: FusedAdam(0.05)], ids=["adagrad", "adam"]
)
def test_a_sparse_gradient_with_repeated_indices_updates_as_its_dense_sum(make):
    start = np.random.default_rng(4).normal(size=(6, 3)).astype(np.float32)
    steps = sparse_gradient_steps()
    results = []
    for use_sparse in (True, False):
        optimizer = make()
        variable = keras.Variable(start.copy())
        optimizer.build([variable])
        apply = compiled_apply(optimizer, variable)
        for sparse, dense in steps:
            apply(sparse if use_sparse else tf.constant(dense))
        results.append(variable.numpy())
    np.testing.assert_allclose(results[0], results[1], rtol=1e-6, atol=1e-7)
    if isinstance(make(), FusedAdagrad):
        grads = [[dense] for _, dense in steps]
        np.testing.assert_allclose(results[0], numpy_adagrad(grads, [start], 0.3, 1.0, 1e-7)[0], rtol=1e-6, atol=1e-6)
        assert np.array_equal(results[0][3], start[3])  # a row no step touched


def test_keras_adagrad_treats_repeated_indices_apart():
    """Why the fused Adagrad sums repeats first: the control for the test above, on Keras' own optimizer (if
    Keras changes this, the module docstring's claim is out of date)."""
    optimizer = keras.optimizers.Adagrad(0.1, initial_accumulator_value=1.0)
    variable = keras.Variable(np.ones((4, 3), np.float32))
    grad = tf.IndexedSlices(tf.constant([[1.0] * 3, [2.0] * 3]), tf.constant([0, 0]), tf.constant([4, 3]))
    optimizer.apply_gradients([(grad, variable)])
    assert optimizer._accumulators[0].numpy()[0, 0] == pytest.approx(1 + 1 + 4)  # dense: 1 + (1 + 2)^2 = 10


@pytest.mark.parametrize("make", [lambda: FusedAdagrad(0.2, initial_accumulator_value=1.0), lambda: FusedAdam(0.01)])
def test_under_a_mirrored_strategy_the_update_is_the_same(make, start):
    grads = gradients(5, 3)
    strategy = get_strategy("mirrored")  # as the Trainer builds it
    mirrored = run(make, grads, start, strategy)
    for m, p in zip(mirrored, run(make, grads, start)):
        np.testing.assert_allclose(m, p, rtol=1e-7, atol=1e-7)


def test_a_checkpoint_of_keras_adagrad_restores_into_the_fused_one(start, tmp_path):
    grads = gradients(6, 4)
    keras_opt = keras.optimizers.Adagrad(0.2, initial_accumulator_value=1.0)
    variables = [keras.Variable(w.copy()) for w in start]
    keras_opt.build(variables)
    for gs in grads[:2]:
        keras_opt.apply_gradients(zip([tf.constant(g) for g in gs], variables))
    path = tf.train.Checkpoint(variables=variables, optimizer=keras_opt).save(str(tmp_path / "ckpt"))

    fused = FusedAdagrad(0.2, initial_accumulator_value=1.0)
    restored = [keras.Variable(np.zeros_like(w)) for w in start]
    fused.build(restored)
    tf.train.Checkpoint(variables=restored, optimizer=fused).restore(path).assert_consumed()
    for a, b in zip(fused._accumulators, keras_opt._accumulators):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    for gs in grads[2:]:
        fused.apply_gradients(zip([tf.constant(g) for g in gs], restored))
    for r, w in zip(restored, numpy_adagrad(grads, start, 0.2, 1.0, 1e-7)):
        np.testing.assert_allclose(r, w, rtol=1e-5, atol=1e-6)


def test_fused_optimizers_round_trip_their_config():
    for optimizer in (FusedAdagrad(0.2, initial_accumulator_value=1.0, epsilon=1e-6), FusedAdam(3e-3, beta_2=0.99)):
        again = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
        assert type(again) is type(optimizer)
        assert again.get_config() == optimizer.get_config()
