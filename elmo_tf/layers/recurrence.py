"""The compiled recurrence shared by the projected-LSTM layers (not a layer; no weights).

Only the recurrent part runs per time step: the input-to-gates products of all steps are computed by
the caller in one matmul. Several independent directions (the forward and the backward stack of a
biLM) advance in the same loop as one batched matmul.

Layout: everything inside the loop is feature-major, `(directions, features, batch)`: the per-step
products are `W^T h^T` with the 4 * units rows on the long side, which the CPU matmul kernels run much
faster than `h W` for the small batches of a time step (measured here at batch 32: about 1.5x).
"""

import tensorflow as tf

FORGET_BIAS = 1.0  # added to the forget gate at run time, never stored in the weights (TF1 LSTMCell)


def input_gates(x_time_major, input_kernel, bias):
    """`x W_x + b` for every step, feature-major: `(time, batch, in)` -> `(time, 4 * units, batch)`."""
    steps, batch = tf.shape(x_time_major)[0], tf.shape(x_time_major)[1]
    kernel_t = tf.transpose(tf.convert_to_tensor(input_kernel))  # (4 * units, in)
    x_t = tf.reshape(tf.transpose(x_time_major, [2, 0, 1]), [tf.shape(x_time_major)[2], steps * batch])
    gates = tf.reshape(tf.matmul(kernel_t, x_t), [tf.shape(kernel_t)[0], steps, batch])  # one big matmul
    return tf.transpose(gates, [1, 0, 2]) + tf.convert_to_tensor(bias)[None, :, None]


def lstm_step(z, c_prev, projection_kernel_t, cell_clip=None, proj_clip=None):
    """One TF1 `LSTMCell(num_proj=...)` step, feature-major, from the gates `z = W^T [x; m] + b` (i, j, f, o
    along axis -2): `c = clip(sigmoid(f + 1) * c_prev + sigmoid(i) * tanh(j))`,
    `m = clip(W_P^T (sigmoid(o) * tanh(c)))`. Shapes `(..., 4 * units, batch)`, `(..., units, batch)`,
    `(..., projection_dim, units)`; returns `c (..., units, batch)`, `m (..., projection_dim, batch)`."""
    i, j, f, o = tf.split(z, 4, axis=-2)
    c = tf.sigmoid(f + FORGET_BIAS) * c_prev + tf.sigmoid(i) * tf.tanh(j)
    if cell_clip:
        c = tf.clip_by_value(c, -cell_clip, cell_clip)
    m = tf.matmul(projection_kernel_t, tf.sigmoid(o) * tf.tanh(c))
    if proj_clip:
        m = tf.clip_by_value(m, -proj_clip, proj_clip)
    return c, m


@tf.function(reduce_retracing=True)
def projected_lstm_scan(
    gates, mask, recurrent_kernels, projection_kernels, initial_c, initial_h, cell_clip=None, proj_clip=None
):
    """Runs D independent projected LSTMs over time.

    Args:
        gates: D tensors `(time, 4 * units, batch)`: `x W_x + b` for every step (see `input_gates`).
        mask: bool `(time, batch)`; where False the state is carried unchanged and the output is 0.
        recurrent_kernels: D tensors `(projection_dim, 4 * units)`.
        projection_kernels: D tensors `(units, projection_dim)`.
        initial_c, initial_h: D tensors `(batch, units)` and `(batch, projection_dim)`.
        cell_clip, proj_clip: python floats or None.
    Returns:
        outputs: D tensors `(time, batch, projection_dim)`; final_c, final_h: D tensors each, the state
        after each row's last unmasked step.
    """
    num = len(gates)
    steps = tf.shape(mask)[0]
    w_h = tf.stack([tf.transpose(k) for k in recurrent_kernels])  # (D, 4 * units, projection_dim)
    w_p = tf.stack([tf.transpose(k) for k in projection_kernels])  # (D, projection_dim, units)
    c0 = tf.stack([tf.transpose(c) for c in initial_c])  # (D, units, batch)
    h0 = tf.stack([tf.transpose(h) for h in initial_h])  # (D, projection_dim, batch)
    gates_all = tf.stack(gates, axis=1)  # (time, D, 4 * units, batch), once
    outputs = tf.TensorArray(h0.dtype, size=steps, element_shape=h0.shape)

    def step(t, c, h, out):
        keep = mask[t][None, None, :]
        z = gates_all[t] + tf.matmul(w_h, h)
        c_new, m = lstm_step(z, c, w_p, cell_clip, proj_clip)
        return (
            t + 1,
            tf.where(keep, c_new, c),
            tf.where(keep, m, h),
            out.write(t, tf.where(keep, m, tf.zeros_like(m))),
        )

    _, c, h, out = tf.while_loop(lambda t, *_: t < steps, step, (tf.constant(0), c0, h0, outputs))
    stacked = tf.transpose(out.stack(), [1, 0, 3, 2])  # (D, time, batch, projection_dim)
    return (
        [stacked[d] for d in range(num)],
        [tf.transpose(c[d]) for d in range(num)],
        [tf.transpose(h[d]) for d in range(num)],
    )
