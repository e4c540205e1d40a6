"""JAX's projected-LSTM loop, reached through the door `elmo_tf.layers.backends` (`projected_lstms`): the values of
`ops_recurrence.ops_lstm_scan` (to float32 rounding), written for XLA's CPU and GPU compilers.

What it does differently from the `keras.ops` loop (measured in `jax.jit` on the original model's shapes, see
docs/backends.md):
- no copy of the weights per call: each direction multiplies by its own stored kernels (`W^T` as the cells hold
  them), where the `keras.ops` loop stacks the transposed kernels of both directions into new tensors (48 MB per
  direction and layer of the original model, copied at every call: an eighth of a call's time);
- the input gates `x W_x + b` of all steps are one matmul per direction before the loop (as there);
- the loop is feature-major, `(features, batch)`, as TensorFlow's: each step's products are `W^T h^T` with the stored
  kernel on the left (XLA's CPU matmul ran the recurrent product of the original's shapes at batch 32 1.3x as fast
  as `h W`, and the whole loop about 1.1x);
- a step where no row has a real token (the padding of a batch padded to a length bucket) skips its matmuls
  (`lax.cond`), leaving the state as it is and its output zero, as the masked step of the `keras.ops` loop does.

Gradients are JAX's own (`jax.grad` through `lax.scan` and `lax.cond`). Imported only on the JAX backend.
"""

import jax.numpy as jnp
from jax import lax
from jax.nn import sigmoid

from elmo_tf.layers import backends
from elmo_tf.layers.lstm_constants import FORGET_BIAS

# the gates of all steps: inputs `(time, batch, in)` by a stored kernel `(4 * units, in)` -> `(time, batch, 4 * units)`
_STEPS_BY_KERNEL = (((2,), (1,)), ((), ()))


def _clip(x, clip):
    return jnp.clip(x, -clip, clip) if clip else x


def _cell_step(z, c, projection_kernel, cell_clip, proj_clip):
    """One TF1 `LSTMCell(num_proj=...)` step, feature-major, from the gates `z` `(4 * units, batch)` (i, j, f, o
    along the rows): the new `c` `(units, batch)` and the projected output `m = W_P^T r` `(projection_dim, batch)`."""
    i, j, f, o = jnp.split(z, 4, axis=0)
    c = _clip(sigmoid(f + FORGET_BIAS) * c + sigmoid(i) * jnp.tanh(j), cell_clip)
    return c, _clip(projection_kernel @ (sigmoid(o) * jnp.tanh(c)), proj_clip)


def lstm_scan(inputs, mask, input_kernels, biases, recurrent_kernels, projection_kernels, initial_c, initial_h,
              cell_clip=None, proj_clip=None, resets=None):  # fmt: skip
    """Runs D independent projected LSTMs over time: `ops_recurrence.ops_lstm_scan`'s arguments (float32, no
    `matmul_dtype`) and results.

    Inside the loop everything is feature-major, `(features, batch)` (see the module docstring).
    """
    num = len(inputs)
    gates = [  # (time, batch, 4 * units): x W_x + b, transposed step by step in the loop
        lax.dot_general(x, w, _STEPS_BY_KERNEL) + b for x, w, b in zip(inputs, input_kernels, biases)
    ]
    keep = jnp.asarray(mask, bool)[:, None, :]  # (time, 1, batch)
    fresh = None if resets is None else [jnp.asarray(r, bool)[:, None, :] for r in resets]

    def advance(carry, xs):
        gates_t, keep_t, fresh_t = xs
        new_carry, outs = [], []
        for d, (c, h) in enumerate(carry):
            if fresh_t is not None:
                c = jnp.where(fresh_t[d], 0.0, c)
                h = jnp.where(fresh_t[d], 0.0, h)
            c_next, m = _cell_step(
                gates_t[d].T + recurrent_kernels[d] @ h, c, projection_kernels[d], cell_clip, proj_clip
            )
            new_carry.append((jnp.where(keep_t, c_next, c), jnp.where(keep_t, m, h)))
            outs.append(jnp.where(keep_t, m, 0.0))
        return tuple(new_carry), tuple(outs)

    def idle(carry, xs):  # no real token in this step: the state as it is, zero outputs
        return carry, tuple(jnp.zeros_like(h) for _, h in carry)

    def step(carry, xs):
        return lax.cond(jnp.any(xs[1]), advance, idle, carry, xs)

    init = tuple((jnp.transpose(c), jnp.transpose(h)) for c, h in zip(initial_c, initial_h))
    xs = (tuple(gates), keep, None if fresh is None else tuple(fresh))
    final, outs = lax.scan(step, init, xs)
    return (
        [jnp.transpose(out, (0, 2, 1)) for out in outs],
        [jnp.transpose(final[d][0]) for d in range(num)],
        [jnp.transpose(final[d][1]) for d in range(num)],
    )


def projected_lstms(args, units, projection_dim, resets, training, implementation, gate_chunk, matmul_dtype):
    """`run_cells`'s loop on `lstm_scan`, reached through the door; declines what `backends.plain_float32_loop`
    refuses (the layer then runs the `keras.ops` loop)."""
    backends.plain_float32_loop(args, implementation, gate_chunk, matmul_dtype)
    return lstm_scan(*args, resets=resets)
