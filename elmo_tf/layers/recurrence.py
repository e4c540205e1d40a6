"""The compiled recurrence shared by the projected-LSTM layers (not a layer; no weights).

Only the recurrent part runs per time step: the input-to-gates products of all steps are computed by
the caller in one matmul. Several independent directions (the forward and the backward stack of a
biLM) advance in the same loop, so their per-step matmuls can run concurrently.
"""
import tensorflow as tf

FORGET_BIAS = 1.0  # added to the forget gate at run time, never stored in the weights (TF1 LSTMCell)


def lstm_step(z, c_prev, projection_kernel, cell_clip=None, proj_clip=None):
    """One TF1 `LSTMCell(num_proj=...)` step from the pre-activation gates `z = [x, m] W + b` (i, j, f, o order).

    Returns the new cell state `c` `(batch, units)` and output `m` `(batch, projection_dim)`:
    `c = clip(sigmoid(f + 1) * c_prev + sigmoid(i) * tanh(j))`, `m = clip((sigmoid(o) * tanh(c)) W_P)`.
    """
    i, j, f, o = tf.split(z, 4, axis=-1)
    c = tf.sigmoid(f + FORGET_BIAS) * c_prev + tf.sigmoid(i) * tf.tanh(j)
    if cell_clip:
        c = tf.clip_by_value(c, -cell_clip, cell_clip)
    m = tf.matmul(tf.sigmoid(o) * tf.tanh(c), projection_kernel)
    if proj_clip:
        m = tf.clip_by_value(m, -proj_clip, proj_clip)
    return c, m


@tf.function(reduce_retracing=True)
def projected_lstm_scan(input_gates, mask, recurrent_kernels, projection_kernels, initial_c, initial_h,
                        cell_clip=None, proj_clip=None):
    """Runs D independent projected LSTMs over time, time-major.

    Args:
        input_gates: D tensors `(time, batch, 4 * units)`: `x W_x + b` for every step.
        mask: bool `(time, batch)`; where False the state is carried unchanged and the output is 0.
        recurrent_kernels: D tensors `(projection_dim, 4 * units)`.
        projection_kernels: D tensors `(units, projection_dim)`.
        initial_c, initial_h: D tensors `(batch, units)` and `(batch, projection_dim)`.
        cell_clip, proj_clip: python floats or None.
    Returns:
        outputs: D tensors `(time, batch, projection_dim)`; final_c, final_h: D tensors each, the state
        after each row's last unmasked step.
    """
    num = len(input_gates)
    steps = tf.shape(mask)[0]
    outputs = [tf.TensorArray(input_gates[d].dtype, size=steps, element_shape=initial_h[d].shape)
               for d in range(num)]

    def step(t, cs, hs, outs):
        keep = mask[t][:, None]
        new_cs, new_hs, new_outs = [], [], []
        for d in range(num):
            z = input_gates[d][t] + tf.matmul(hs[d], recurrent_kernels[d])
            c, m = lstm_step(z, cs[d], projection_kernels[d], cell_clip, proj_clip)
            new_cs.append(tf.where(keep, c, cs[d]))
            new_hs.append(tf.where(keep, m, hs[d]))
            new_outs.append(outs[d].write(t, tf.where(keep, m, tf.zeros_like(m))))
        return t + 1, new_cs, new_hs, new_outs

    _, cs, hs, outs = tf.while_loop(lambda t, *_: t < steps, step,
                                    (tf.constant(0), list(initial_c), list(initial_h), outputs))
    return [o.stack() for o in outs], cs, hs
