"""elmo_tf/layers/backends/tensorflow_precision.py: a layer's bfloat16 copies, converted once and again only when its
weights change; and TensorFlow's loops on those copies (tensorflow_recurrence, tensorflow_training_scan,
ops_recurrence), which convert no kernel per step."""

import numpy as np
import pytest
import tensorflow as tf
from test_tensorflow_recurrence import _problem

from elmo_tf.layers import Highway
from elmo_tf.layers.backends import tensorflow_recurrence
from elmo_tf.layers.backends.tensorflow_recurrence import fast_gradient_scan, projected_lstm_scan
from elmo_tf.layers.ops_recurrence import ops_lstm_scan

KERNELS = ("input_kernels", "recurrent_kernels", "projection_kernels")


def _highway(seed=0):
    layer = Highway(2, precision="bfloat16")
    layer.build((None, 6))
    rng = np.random.default_rng(seed)
    for variable in layer.weights:
        variable.assign(rng.normal(0, 0.5, size=variable.shape).astype(np.float32))
    return layer, layer._low_precision


def _copies_match(layer, holder):
    for source, copy in zip(holder.sources, holder.copies):
        np.testing.assert_array_equal(copy.numpy(), tf.cast(source.value, tf.bfloat16).numpy())


def test_copies_are_converted_once_and_again_only_after_an_assign():
    layer, holder = _highway()
    x = tf.constant(np.random.default_rng(1).normal(size=(4, 6)), tf.float32)
    layer(x)
    converted = int(holder.conversions.numpy())
    run = tf.function(lambda x: layer(x))
    for _ in range(3):
        layer(x)
        run(x)
    assert int(holder.conversions.numpy()) == converted  # not per call, eager or traced
    _copies_match(layer, holder)
    layer.carry_kernels[0].assign(layer.carry_kernels[0] * 2.0)  # eager assign: stale
    assert bool(holder.stale.numpy())
    doubled = run(x)
    assert int(holder.conversions.numpy()) == converted + 1
    _copies_match(layer, holder)
    fresh = Highway(2, precision="bfloat16")
    fresh.build((None, 6))
    fresh.set_weights(layer.get_weights())
    np.testing.assert_array_equal(doubled.numpy(), fresh(x).numpy())

    @tf.function
    def scale_in_graph():
        layer.transform_kernels[1].assign(layer.transform_kernels[1] * 0.5)

    scale_in_graph()  # an assign in a traced function marks them too
    run(x)
    assert int(holder.conversions.numpy()) == converted + 2
    _copies_match(layer, holder)


def test_a_gradient_through_the_copies_reaches_the_weights_and_marks_them_stale():
    """A tape over an inference call: the float32 variables get the gradient of `tf.cast`; the copies are stale
    afterwards (an optimizer step writes the tf.Variable underneath, which no Keras assign sees)."""
    layer, holder = _highway()
    x = tf.constant(np.random.default_rng(2).normal(size=(4, 6)), tf.float32)
    layer(x)
    assert not bool(holder.stale.numpy())
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(layer(x)))
    grads = tape.gradient(loss, layer.trainable_variables)
    assert all(g is not None and g.dtype == tf.float32 for g in grads)
    assert all(float(tf.reduce_max(tf.abs(g))) > 0 for g in grads)
    assert bool(holder.stale.numpy())
    layer.carry_kernels[0].value.assign_sub(0.1 * grads[0])  # as TF's optimizers write: no Keras assign
    layer(x)
    _copies_match(layer, holder)


def test_copies_are_neither_keras_weights_nor_checkpointed(tmp_path):
    layer, holder = _highway()
    assert len(layer.weights) == 8 and all(v.dtype == "float32" for v in layer.weights)
    path = tf.train.Checkpoint(layer=layer).write(str(tmp_path / "ckpt"))
    names = [name for name, _ in tf.train.list_variables(path)]
    assert names and not any("bfloat16" in name for name in names)


def _scan_args(num=2, dtype=tf.bfloat16):
    args, mask, resets, _ = _problem(seed=5, num=num, kernel_scale=0.5)
    low = {k: [tf.cast(w, dtype) for w in args[k]] if k in KERNELS else v for k, v in args.items()}
    return args, low, mask, resets


class _CastSpy:
    """Records `tf.cast`s to another dtype of kernel-shaped tensors (as given, transposed, or the directions stacked)
    made inside a while loop's body while a function is traced."""

    def __init__(self, monkeypatch, shapes, num=2):
        shapes = [tuple(s) for s in shapes]
        shapes += [s[::-1] for s in shapes]  # transposed (the keras.ops loop's layout)
        self.shapes, self.seen, self.inside = set(shapes + [(num, *s) for s in shapes]), [], 0  # and stacked
        cast = tf.cast

        def spy(x, dtype, name=None):
            graph = tf.compat.v1.get_default_graph()
            while graph is not None:
                if type(graph).__name__ == "WhileBodyFuncGraph":
                    self.inside += 1
                    same = getattr(x, "dtype", None) == tf.as_dtype(dtype)  # no op: tf.cast returns `x`
                    if tuple(getattr(x, "shape", ())) in self.shapes and not same:
                        self.seen.append((tuple(x.shape), x.dtype.name, tf.as_dtype(dtype).name))
                    break
                graph = getattr(graph, "outer_graph", None)
            return cast(x, dtype, name=name)

        monkeypatch.setattr(tf, "cast", spy)


@pytest.mark.parametrize("loop", ["scan", "stacked_scan", "chunked_scan", "fast_gradient", "ops"])
def test_the_loops_convert_no_kernel_per_step(loop, monkeypatch):
    """Traced anew with bfloat16 kernels (a layer's copies), no loop body casts a kernel-shaped tensor (it casts the
    per-step operands, so the spy sees casts there); the outputs are float32."""
    _, low, mask, resets = _scan_args()
    spy = _CastSpy(monkeypatch, [w.shape for k in KERNELS for w in low[k]])
    if loop == "ops":
        run = tf.function(lambda: ops_lstm_scan(mask=mask, resets=resets, matmul_dtype="bfloat16", **low))
    elif loop == "fast_gradient":
        run = tf.function(lambda: fast_gradient_scan(mask=mask, resets=resets, matmul_dtype="bfloat16", **low))
    else:
        options = {"stacked_scan": dict(stack_directions=True), "chunked_scan": dict(chunk=3)}.get(loop, {})
        scan = projected_lstm_scan.python_function  # a fresh trace, not the module's cached one
        run = tf.function(lambda: scan(mask=mask, resets=resets, **low, **options))
    outs, cs, hs = run()
    assert spy.inside > 0 and spy.seen == []
    assert all(t.dtype == tf.float32 for t in outs + cs + hs)


def test_the_loops_on_bfloat16_copies_agree():
    """The inference scan on bfloat16 copies, its stacked and chunked forms, the keras.ops loop and the training scan
    (given the float32 kernels, rounding them per call) compute the same roundings: equal up to float32's summation
    order; and within bfloat16's error of the float32 scan."""
    plain, low, mask, resets = _scan_args()
    reference = projected_lstm_scan(mask=mask, resets=resets, **low)
    others = [
        projected_lstm_scan(mask=mask, resets=resets, stack_directions=True, **low),
        projected_lstm_scan(mask=mask, resets=resets, chunk=3, **low),
        ops_lstm_scan(mask=mask, resets=resets, matmul_dtype="bfloat16", **low),
        fast_gradient_scan(mask=mask, resets=resets, matmul_dtype="bfloat16", **plain),
    ]
    want = [t.numpy() for group in reference for t in group]
    for other in others:
        got = [t.numpy() for group in other for t in group]
        for w, g in zip(want, got):
            np.testing.assert_allclose(g, w, atol=2e-3, rtol=0)
    exact = [t.numpy() for group in projected_lstm_scan(mask=mask, resets=resets, **plain) for t in group]
    for w, e in zip(want, exact):
        assert 0 < np.abs(w - e).max() <= 0.02 * np.abs(e).max()


def test_the_native_branch_runs_where_the_matmul_rounds_to_nearest(monkeypatch):
    """Where TF's own bfloat16 matmul rounds to nearest (AVX512_BF16, AMX, GPUs) the loop runs it on the copies. Forced
    here (this CPU's Eigen matmul truncates, so its error is larger, within 2x of the emulation's bound); on such a
    CPU this is the path every test above takes."""
    monkeypatch.setattr(tensorflow_recurrence, "rounds_to_nearest", lambda dtype: True)
    plain, low, mask, resets = _scan_args()
    products = tensorflow_recurrence.Products(tf.bfloat16, tf.float32)
    assert products.rounding is None and products.low == tf.bfloat16
    scan = tf.function(projected_lstm_scan.python_function)
    got = [t.numpy() for group in scan(mask=mask, resets=resets, **low) for t in group]
    exact = [t.numpy() for group in projected_lstm_scan(mask=mask, resets=resets, **plain) for t in group]
    for g, e in zip(got, exact):
        assert g.dtype == np.float32
        assert 0 < np.abs(g - e).max() <= 0.04 * np.abs(e).max()
