"""The projected-LSTM loop in `keras.ops`: the recurrence of every Keras backend (TensorFlow, JAX, PyTorch).

`ops_lstm_scan` is `backends.tensorflow_recurrence.projected_lstm_scan` (same arguments, same values to float
rounding) written with `keras.ops.scan` (JAX: `lax.scan`, compiled under `jax.jit`; PyTorch: a Python loop;
TensorFlow: a while loop), so a biLM runs, trains (each backend's automatic gradient: `jax.grad`, `loss.backward()`)
and saves on any backend. Layers reach it through `projected_lstm.run_cells` with `implementation="ops"`, which
"auto" means on every backend but TensorFlow; TensorFlow keeps its own loops (`backends.tensorflow_recurrence`:
feature-major matmuls, a hand-written gradient).

Layout: batch-major, `(D, batch, features)`: the D directions (a biLM layer's forward and backward stacks) advance
stacked, one batched matmul per product and one set of element-wise ops per step for all of them. The input gates
`x W_x + b` of all steps are one batched matmul before the loop; only the recurrent part runs per step.

Where a TensorFlow op does better than Keras's in graphs (`tf.scan`, `tf.reverse_sequence`), it comes through the
door `elmo_tf.layers.backends`; this module imports no TensorFlow.
"""

import keras
from keras import ops

from elmo_tf.layers import backends, low_precision
from elmo_tf.layers.lstm_constants import FORGET_BIAS


def scan_carries(step, init, xs, reverse=False):
    """`keras.ops.scan(step, init, xs, reverse)` for a `step(carry, x)` that returns `(carry, carry)`: the final carry
    and the carries of every step, stacked. On TensorFlow it is `tf.scan`: Keras's TensorFlow scan fails in a graph
    where the number of steps is unknown and there are several inputs (it asserts on the static length, None there).
    Needs at least one step (the final carry is the last one stacked there)."""
    try:
        return backends.scan_carries(step, init, xs, reverse)
    except NotImplementedError:
        return ops.scan(step, init, xs, reverse=reverse)


def reverse_by_lengths(x, lengths):
    """Each column's first `lengths[b]` steps reversed, the rest left in place: `tf.reverse_sequence(x, lengths,
    seq_axis=0, batch_axis=1)` in `keras.ops`.

    Args:
        x: `(time, batch, ...)`.
        lengths: int `(batch,)`, each at most `time`.
    Returns:
        `x`'s shape and dtype.
    """
    steps = ops.shape(x)[0]
    t = ops.expand_dims(ops.arange(steps, dtype="int32"), 1)  # (time, 1)
    n = ops.expand_dims(ops.cast(lengths, "int32"), 0)  # (1, batch)
    index = ops.where(t < n, n - 1 - t, t)  # (time, batch)
    index = ops.reshape(index, tuple(ops.shape(index)) + (1,) * (len(x.shape) - 2))
    return ops.take_along_axis(x, ops.broadcast_to(index, ops.shape(x)), axis=0)


def reverse_sequences(x, lengths):
    """`reverse_by_lengths`, as `tf.reverse_sequence` itself on the TensorFlow backend."""
    try:
        return backends.reverse_sequences(x, lengths)
    except NotImplementedError:
        return reverse_by_lengths(x, lengths)


def _low(matmul_dtype):
    return matmul_dtype is not None and keras.backend.standardize_dtype(matmul_dtype) != "float32"


def _matmul(a, b, matmul_dtype=None):
    """`a @ b` in `matmul_dtype` (None: `a`'s dtype), the product back in `a`'s dtype; in bfloat16, `b` a bfloat16
    copy or `low_precision.loop_operand`'s form (`low_precision.matmul`: bfloat16 operands, float32 accumulation,
    the same numbers where the backend's bfloat16 matmul does not round to nearest)."""
    if not _low(matmul_dtype):
        return ops.matmul(a, b)
    return low_precision.matmul(a, b, dtype=a.dtype)


def _clip(x, clip):
    return ops.clip(x, -clip, clip) if clip else x


def lstm_update(z, c, projection_kernel, cell_clip=None, proj_clip=None, matmul_dtype=None):
    """One TF1 `LSTMCell(num_proj=...)` step, batch-major, from the gates `z = x W_x + h W_h + b` (i, j, f, o along
    the last axis): `c = clip(sigmoid(f + 1) c + sigmoid(i) tanh(j))`, `m = clip((sigmoid(o) tanh(c)) W_P)`.

    Args:
        z: `(..., batch, 4 * units)`; c: `(..., batch, units)`; projection_kernel: `W_P` `(..., units, proj)`.
    Returns:
        the new `c (..., batch, units)` and `m (..., batch, proj)`.
    """
    i, j, f, o = ops.split(z, 4, axis=-1)
    c = _clip(ops.sigmoid(f + FORGET_BIAS) * c + ops.sigmoid(i) * ops.tanh(j), cell_clip)
    return c, _clip(_matmul(ops.sigmoid(o) * ops.tanh(c), projection_kernel, matmul_dtype), proj_clip)


def ops_lstm_scan(
    inputs,
    mask,
    input_kernels,
    biases,
    recurrent_kernels,
    projection_kernels,
    initial_c,
    initial_h,
    cell_clip=None,
    proj_clip=None,
    resets=None,
    matmul_dtype=None,
):
    """Runs D independent projected LSTMs (TF1 `LSTMCell(num_proj=...)`, gates in i, j, f, o order) over time.

    Per step and direction: `z = x W_x + h W_h + b`, `c = clip(sigmoid(f + 1) c + sigmoid(i) tanh(j))`,
    `h = clip((sigmoid(o) tanh(c)) W_P)`; where `mask` is False the state is carried unchanged and the output is 0.

    Args:
        inputs: D float tensors `(time, batch, in)` (time-major; dropout, if any, already applied).
        mask: bool `(time, batch)`.
        input_kernels, biases: D tensors `(4 * units, in)` (`W_x^T`, as the cells store them) and `(4 * units,)`.
        recurrent_kernels: D tensors `(4 * units, projection_dim)` (`W_h^T`).
        projection_kernels: D tensors `(projection_dim, units)` (`W_P^T`).
        initial_c, initial_h: D tensors `(batch, units)` and `(batch, projection_dim)`.
        cell_clip, proj_clip: python floats or None.
        resets: None, or D bool `(time, batch)`: where True the step starts from the zero state (a new segment).
        matmul_dtype: None, or the dtype the matmuls run in (e.g. "bfloat16"; each product comes back in the
            inputs' dtype, the state and the element-wise math stay in it). The kernels are converted once per call,
            before the loop (`low_precision.loop_operand`; nothing to convert where they come as a layer's bfloat16
            copies), never per step.
    Returns:
        D outputs `(time, batch, projection_dim)`, D final c `(batch, units)`, D final h `(batch, projection_dim)`.
    """
    num = len(inputs)
    dtype = inputs[0].dtype
    w_x = ops.stack([ops.transpose(ops.convert_to_tensor(w)) for w in input_kernels])  # (D, in, 4 * units)
    w_h = ops.stack([ops.transpose(ops.convert_to_tensor(w)) for w in recurrent_kernels])  # (D, proj, 4 * units)
    w_p = ops.stack([ops.transpose(ops.convert_to_tensor(w)) for w in projection_kernels])  # (D, units, proj)
    if _low(matmul_dtype):  # once per call, not per step
        w_x, w_h, w_p = (low_precision.loop_operand(w) for w in (w_x, w_h, w_p))
    bias = ops.reshape(ops.stack([ops.convert_to_tensor(b) for b in biases]), (num, 1, 1, -1))  # (D, 1, 1, 4 * units)
    x = ops.stack([ops.convert_to_tensor(t) for t in inputs])  # (D, time, batch, in)
    steps, batch = ops.shape(x)[1], ops.shape(x)[2]
    # the input gates of all steps, one batched matmul: (D, time * batch, 4 * units) -> (time, D, batch, 4 * units)
    gates = _matmul(ops.reshape(x, (num, -1, ops.shape(x)[-1])), w_x, matmul_dtype)
    gates = ops.transpose(ops.reshape(gates, (num, steps, batch, -1)) + bias, (1, 0, 2, 3))
    keep = ops.cast(mask, "bool")[:, None, :, None]  # (time, 1, batch, 1)
    fresh = None
    if resets is not None:
        fresh = ops.stack([ops.cast(r, "bool") for r in resets], axis=1)[:, :, :, None]  # (time, D, batch, 1)
    c0 = ops.stack([ops.convert_to_tensor(c) for c in initial_c])  # (D, batch, units)
    h0 = ops.stack([ops.convert_to_tensor(h) for h in initial_h])  # (D, batch, proj)

    def step(carry, xs):
        c, h = carry
        if fresh is None:
            z, kept = xs
        else:
            z, kept, new = xs
            c = ops.where(new, ops.zeros_like(c), c)
            h = ops.where(new, ops.zeros_like(h), h)
        c_next, m = lstm_update(z + _matmul(h, w_h, matmul_dtype), c, w_p, cell_clip, proj_clip, matmul_dtype)
        c = ops.where(kept, c_next, c)
        h = ops.where(kept, m, h)
        return (c, h), ops.where(kept, m, ops.zeros_like(m))

    xs = (gates, keep) if fresh is None else (gates, keep, fresh)
    try:  # on TensorFlow (where its own loops run, this one only as their reference): `tf.scan`
        (c, h), outs = backends.scan_with_outputs(step, (c0, h0), xs, ops.zeros_like(h0))
    except NotImplementedError:
        (c, h), outs = ops.scan(step, (c0, h0), xs)
    outs = ops.cast(outs, dtype)  # (time, D, batch, proj)
    return (
        [outs[:, d] for d in range(num)],
        [c[d] for d in range(num)],
        [h[d] for d in range(num)],
    )
