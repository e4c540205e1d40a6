"""TensorFlow's loops that run projected LSTMs over time: functions of tensors (no layer, no weights).

`projected_lstm_scan` (inference, and TF's automatic gradient) and `fast_gradient_scan` (training: the same values
with a hand-written backward pass). Layers reach them through `projected_lstm.run_cells`, which calls the door
`elmo_tf.layers.backends.projected_lstms` (`tensorflow_fast_paths` picks a loop here by the layer's `implementation`);
`ops_recurrence.ops_lstm_scan` is the `keras.ops` loop of every backend.

The input-to-gates products `x W_x + b` are computed for many steps in one matmul (all steps, or chunks
of `chunk` steps, which bounds the memory of the gates to `chunk` steps); only the recurrent part runs per
time step, in a compiled loop. Several independent directions (the forward and the backward stack of a
biLM) advance in the same loop as one batched matmul.

Layout: everything inside the loop is feature-major, `(directions, features, batch)`: the per-step
products are `W^T h^T` with the 4 * units rows on the long side, which the CPU matmul kernels run much
faster than `h W` for the small batches of a time step (measured here at batch 32: about 1.5x).

Segments: `resets` marks steps that start from the zero state instead of the carried one, so one row
can hold several independent sequences back to back (packed rows, no padding between them); a segment
then gets exactly the outputs it gets alone in a row.
"""

from functools import partial

import tensorflow as tf

from elmo_tf.layers.backends.tensorflow_training_scan import fast_gradient_scan
from elmo_tf.layers.lstm_constants import FORGET_BIAS
from elmo_tf.layers.matmul_precision import round_to, rounds_to_nearest

__all__ = ["Products", "fast_gradient_scan", "lstm_step", "projected_lstm_scan", "stack_directions"]

# Below this many elements per recurrent kernel (4 * units * projection_dim) the directions advance as one stacked
# tensor (one batched matmul and one set of element-wise ops per step: per-op overhead dominates small models,
# the tiny test models run about 1.3x faster so); above it, one matmul per direction (TF's batched matmul runs at
# 55-70% of two plain ones at the original's 4096 x 512 and already at 384 x 192).
STACK_DIRECTIONS_BELOW = 1 << 15


def stack_directions(units, projection_dim):
    """Whether `projected_lstm_scan` should stack the directions for kernels of this size."""
    return 4 * units * projection_dim < STACK_DIRECTIONS_BELOW


class Products:
    """The scan's matmuls `W x` in the kernels' dtype: float32 kernels, a plain `tf.matmul`; bfloat16 kernels (a
    layer's copies, `precision="bfloat16"`), the state-side operand cast to bfloat16 and the product back to the
    state's dtype, or, where this device's bfloat16 matmul does not round to nearest (`matmul_precision`), the kernels
    widened once per call and operands and products rounded to bfloat16 in float32: the same numbers.

    Args:
        kernel_dtype: the kernels' dtype; state_dtype: the inputs' and state's dtype (float32).
    """

    def __init__(self, kernel_dtype, state_dtype):
        self.state = state_dtype
        self.low = kernel_dtype if kernel_dtype != state_dtype else None
        self.rounding = self.low if self.low is not None and not rounds_to_nearest(self.low) else None

    def kernel(self, w):
        """A kernel as the loop holds it (once per call): widened to the state's dtype where emulated."""
        return tf.cast(w, self.state) if self.rounding else w

    def __call__(self, w, x, transpose_b=False):
        """`w @ x` (`x` transposed with `transpose_b`), `x` in the state's dtype, returned in it."""
        if self.low is None:
            return tf.matmul(w, x, transpose_b=transpose_b)
        if self.rounding:
            return round_to(tf.matmul(w, round_to(x, self.rounding), transpose_b=transpose_b), self.rounding)
        return tf.cast(tf.matmul(w, tf.cast(x, self.low), transpose_b=transpose_b), self.state)


def lstm_step(z, c_prev, projection_kernel_t, cell_clip=None, proj_clip=None, products=tf.matmul):
    """One TF1 `LSTMCell(num_proj=...)` step, feature-major, from the gates `z = W^T [x; m] + b` (i, j, f, o
    along axis -2): `c = clip(sigmoid(f + 1) * c_prev + sigmoid(i) * tanh(j))`,
    `m = clip(W_P^T (sigmoid(o) * tanh(c)))`. Shapes `(4 * units, batch)`, `(units, batch)`, `W_P^T`
    `(projection_dim, units)`; returns `c (units, batch)`, `m (projection_dim, batch)`. `products`: how `W_P^T r` is
    multiplied (a `Products`)."""
    i, j, f, o = tf.split(z, 4, axis=-2)
    c = tf.sigmoid(f + FORGET_BIAS) * c_prev + tf.sigmoid(i) * tf.tanh(j)
    if cell_clip:
        c = tf.clip_by_value(c, -cell_clip, cell_clip)
    m = products(projection_kernel_t, tf.sigmoid(o) * tf.tanh(c))
    if proj_clip:
        m = tf.clip_by_value(m, -proj_clip, proj_clip)
    return c, m


def _input_gates(products, inputs, input_kernels, biases, batch, gate_rows, start, size):
    """D tensors `(4 * units, size, batch)`: `W_x^T x + b` of steps start .. start + size, one matmul each."""
    gates = []
    for x, w_x, b in zip(inputs, input_kernels, biases):
        x = tf.reshape(x[start : start + size], [size * batch, tf.shape(x)[-1]])
        z = products(w_x, x, transpose_b=True) + b  # (4 * units, size * batch)
        gates.append(tf.reshape(z, [gate_rows, size, batch]))
    return gates


def _chunk_steps(
    products,
    num,
    keep_all,
    fresh_all,
    recurrent_kernels,
    projection_kernels,
    clips,
    gates,
    start,
    size,
    c,
    h,
    out,
):
    """`projected_lstm_scan`'s `run` of one chunk (for `_over_chunks`): one matmul per direction a step."""

    def step(k, c, h, out):
        t = start + k
        keep = keep_all[t]
        new_c, new_h, new_out = [], [], []
        for d in range(num):
            c_d, h_d = c[d], h[d]
            if fresh_all is not None:
                fresh = fresh_all[d][t]
                c_d = tf.where(fresh, tf.zeros_like(c_d), c_d)
                h_d = tf.where(fresh, tf.zeros_like(h_d), h_d)
            z = gates[d][:, k, :] + products(recurrent_kernels[d], h_d)
            c_next, m = lstm_step(z, c_d, projection_kernels[d], *clips, products)
            new_c.append(tf.where(keep, c_next, c_d))
            new_h.append(tf.where(keep, m, h_d))
            new_out.append(out[d].write(t, tf.where(keep, m, tf.zeros_like(m))))
        return k + 1, tuple(new_c), tuple(new_h), tuple(new_out)

    _, c, h, out = tf.while_loop(lambda k, *_: k < size, step, (tf.constant(0), c, h, out))
    return c, h, out


@tf.function(reduce_retracing=True, autograph=False)
def projected_lstm_scan(
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
    chunk=None,
    stack_directions=False,
):
    """Runs D independent projected LSTMs over time.

    Args:
        inputs: D tensors `(time, batch, in)` (time-major; dropout, if any, already applied).
        mask: bool `(time, batch)`; where False the state is carried unchanged and the output is 0.
        input_kernels, biases: D tensors `(4 * units, in)` (`W_x^T`) and `(4 * units,)`.
        recurrent_kernels: D tensors `(4 * units, projection_dim)` (`W_h^T`).
        projection_kernels: D tensors `(projection_dim, units)` (`W_P^T`).
        initial_c, initial_h: D tensors `(batch, units)` and `(batch, projection_dim)`.
        cell_clip, proj_clip: python floats or None.
        resets: None, or D bool tensors `(time, batch)`: where True the step starts from the zero state
            (a new segment), not from the carried one.
        chunk: python int or None: the input gates are computed `chunk` steps at a time (memory of the gates
            bounded by `chunk * batch` steps) instead of for all steps at once.
        stack_directions: python bool: advance the directions as one stacked tensor (for small kernels: see
            `stack_directions`) instead of one matmul per direction. Same results.
    The matmuls run in the kernels' dtype (`Products`: bfloat16 copies of a layer's kernels, float32 accumulation).
    Returns:
        outputs: D tensors `(time, batch, projection_dim)`; final_c, final_h: D tensors each, the state
        after each row's last unmasked step.
    """
    num = len(inputs)
    steps, batch = tf.shape(mask)[0], tf.shape(mask)[1]
    # kernels come stored as the matmuls read them (`W^T`): the CPU kernels run `W^T h` with W^T in memory about
    # 5x faster than with `transpose_a` at a step's batch, and one matmul per direction (no stacked copy) beats
    # a batched matmul; so nothing is copied per call
    input_kernels = [tf.convert_to_tensor(k) for k in input_kernels]  # (4 * units, in)
    products = Products(input_kernels[0].dtype, initial_h[0].dtype)
    input_kernels = [products.kernel(k) for k in input_kernels]
    recurrent_kernels = [products.kernel(tf.convert_to_tensor(k)) for k in recurrent_kernels]  # (4 * units, proj)
    projection_kernels = [products.kernel(tf.convert_to_tensor(k)) for k in projection_kernels]  # (proj, units)
    biases = [tf.convert_to_tensor(b)[:, None] for b in biases]  # (4 * units, 1)
    c0 = tuple(tf.transpose(c) for c in initial_c)  # (units, batch)
    h0 = tuple(tf.transpose(h) for h in initial_h)  # (projection_dim, batch)
    gate_rows = tf.shape(input_kernels[0])[0]
    keep_all = mask[:, None, :]  # (time, 1, batch)
    fresh_all = None if resets is None else [r[:, None, :] for r in resets]
    outputs = tuple(tf.TensorArray(h.dtype, size=steps, element_shape=h.shape) for h in h0)

    gates_for = partial(_input_gates, products, inputs, input_kernels, biases, batch, gate_rows)

    clips = (cell_clip, proj_clip)
    if num > 1 and stack_directions:
        kernels, state = (recurrent_kernels, projection_kernels), (c0, h0)
        return _stacked_scan(products, gates_for, steps, chunk, keep_all, fresh_all, kernels, state, clips)

    run = partial(_chunk_steps, products, num, keep_all, fresh_all, recurrent_kernels, projection_kernels, clips)
    c, h, outputs = _over_chunks(run, gates_for, steps, chunk, c0, h0, outputs)
    return (
        [tf.transpose(o.stack(), [0, 2, 1]) for o in outputs],  # (time, batch, projection_dim)
        [tf.transpose(x) for x in c],
        [tf.transpose(x) for x in h],
    )


def _stacked_scan(products, gates_for, steps, chunk, keep_all, fresh_all, kernels, state, clips):
    """`projected_lstm_scan` with the D directions stacked: state `(D, features, batch)`, one batched matmul and one
    set of element-wise ops per step for all directions (for small kernels, see STACK_DIRECTIONS_BELOW). `kernels`:
    the D recurrent and the D projection kernels; `state`: the D initial c and h; `clips`: (cell_clip, proj_clip)."""
    (recurrent_kernels, projection_kernels), (c0, h0), (cell_clip, proj_clip) = kernels, state, clips
    num = len(c0)
    w_h = tf.stack(recurrent_kernels)  # (D, 4 * units, projection_dim)
    w_p = tf.stack(projection_kernels)  # (D, projection_dim, units)
    fresh_all = None if fresh_all is None else tf.stack(fresh_all, axis=1)  # (time, D, 1, batch)
    c0, h0 = tf.stack(c0), tf.stack(h0)
    outputs = tf.TensorArray(h0.dtype, size=steps, element_shape=h0.shape)

    def run(gates, start, size, c, h, out):
        gates = tf.stack(gates)  # (D, 4 * units, size, batch)

        def step(k, c, h, out):
            t = start + k
            keep = keep_all[t][None]
            if fresh_all is not None:
                c = tf.where(fresh_all[t], tf.zeros_like(c), c)
                h = tf.where(fresh_all[t], tf.zeros_like(h), h)
            z = gates[:, :, k, :] + products(w_h, h)
            c_next, m = lstm_step(z, c, w_p, cell_clip, proj_clip, products)
            return k + 1, tf.where(keep, c_next, c), tf.where(keep, m, h), out.write(t, tf.where(keep, m, 0.0))

        _, c, h, out = tf.while_loop(lambda k, *_: k < size, step, (tf.constant(0), c, h, out))
        return c, h, out

    c, h, outputs = _over_chunks(run, gates_for, steps, chunk, c0, h0, outputs)
    stacked = tf.transpose(outputs.stack(), [1, 0, 3, 2])  # (D, time, batch, projection_dim)
    return (
        [stacked[d] for d in range(num)],
        [tf.transpose(c[d]) for d in range(num)],
        [tf.transpose(h[d]) for d in range(num)],
    )


def _over_chunks(run, gates_for, steps, chunk, c, h, out):
    """Runs `run(gates, start, size, c, h, out)` over all steps at once (`chunk` None) or `chunk` steps at a time,
    each time with the input gates of just those steps; returns the final `(c, h, out)`."""
    if chunk is None:
        return run(gates_for(0, steps), 0, steps, c, h, out)

    def one_chunk(start, c, h, out):
        size = tf.minimum(chunk, steps - start)
        c, h, out = run(gates_for(start, size), start, size, c, h, out)
        return start + size, c, h, out

    # one chunk at a time: a chunk's gates depend on `start` alone, so with while_loop's default of 10 parallel
    # iterations TensorFlow computed the gates of up to 10 chunks ahead of the recurrence, and the gates' memory grew
    # with the steps of a batch, up to 10 chunks' worth (the original model at batch 64: 2,017 -> 1,593 MiB peak RSS
    # in bench/embed_throughput.py, speed unchanged; bench/README.md, "Corpus scale")
    _, c, h, out = tf.while_loop(
        lambda start, *_: start < steps, one_chunk, (tf.constant(0), c, h, out), parallel_iterations=1
    )
    return c, h, out
