"""TensorFlow's training loop of projected LSTMs: `fast_gradient_scan`, the forward values of
`tensorflow_recurrence.projected_lstm_scan` with a hand-written backward pass (its design is in its docstring).

Reached through `tensorflow_fast_paths.projected_lstms` (the door `elmo_tf.layers.backends`) by the layers'
`implementation` ("auto" in training, "fast_gradient"); `tensorflow_recurrence` re-exports it.
"""

import tensorflow as tf

from elmo_tf.layers.lstm_constants import FORGET_BIAS
from elmo_tf.layers.matmul_precision import round_to, rounds_to_nearest


def _zeros_if_none(grad, like):
    return tf.zeros_like(like) if grad is None else grad


def _clip(x, clip):
    """`tf.clip_by_value(x, -clip, clip)` as one op (TF's is a minimum and a maximum), for values whose gradient is
    written by hand; `x` itself when `clip` is None."""
    return tf.raw_ops.ClipByValue(t=x, clip_value_min=-clip, clip_value_max=clip) if clip else x


def _clip_passes(x, clip):
    """Where `tf.clip_by_value(x, -clip, clip)` passes its gradient (TF: `-clip <= x <= clip`)."""
    return (x >= -clip) & (x <= clip)


def _gates_last(t):
    """Rows `(i, j, f, o)` of a `(4 * units, ...)` tensor as `(i, f, o, j)`: the three sigmoid gates first, so one
    sigmoid and one tanh cover a step's gates (slices along the first axis share memory, no copy)."""
    i, j, f, o = tf.split(t, 4, axis=0)
    return tf.concat([i, f, o, j], axis=0)


def _gates_back(t):
    """The inverse of `_gates_last`: rows `(i, f, o, j)` back to `(i, j, f, o)`."""
    i, f, o, j = tf.split(t, 4, axis=0)
    return tf.concat([i, j, f, o], axis=0)


def fast_gradient_scan(
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
    """`projected_lstm_scan` for training: the same forward values, with a hand-written backward pass.

    TensorFlow's gradient of the step loop accumulates every weight gradient inside the backward loop, one
    rank-`batch` update of the whole kernel per step (4 * units * projection_dim floats written per step and
    direction), and runs `W^T dz` with `transpose_a` at a step's batch (20-35% of the plain matmul). Here the
    backward loop does only what is sequential, `dh = W_h dz` and `dr = W_P dm` with transposed copies made
    once per call, and stores each step's gate gradient `dz`; the weight and input gradients then come from
    a few large matmuls over all steps at once (`dW_h = dZ H^T`, `dW_x = dZ X`, `dX = W_x^T dZ`, `dW_P = dM R^T`).

    The per-step element-wise work is what costs at a step's batch (each op touches only `units * batch` floats
    per direction, so its fixed cost is about its arithmetic), so the loops hold as few ops as possible:
    - the D directions advance stacked: one plain matmul per direction (no batched matmul, see
      STACK_DIRECTIONS_BELOW) but one set of element-wise ops for all;
    - gates are laid out `(4, D, units, batch)` in the order `(i, f, o, j)` (the kernels' rows are reordered once
      per call, the forget bias added to the bias once per call): one sigmoid and one tanh per step, and the
      gates are slices of one tensor, no split or concat copies;
    - the masks are broadcast once per call to the shapes they select in (a broadcasting select costs several
      times a plain one);
    - the backward loop reads each step's saved values and does its derivative math per step, on tensors that stay
      in cache (computing the derivatives in passes over all steps before the loop made one layer alone 0.82-0.92x
      as fast: memory-bound passes); `dz` is written direction-major `(D, 4, units, batch)`, so each direction's
      `W_h dz` reads a contiguous slice.
    The forward loop saves the gates after their activations, the cell before clipping, the state each step
    started from, the projection before clipping and `o * tanh(c)`: per step and direction `7 * units +
    2 * projection_dim` floats times the batch; the outputs are the clipped projections, masked, over all steps.

    `matmul_dtype` (None: the inputs' dtype): the dtype every matmul runs in, forward and backward, e.g.
    `"bfloat16"`: the kernels are cast once per call (not at all when they come in bfloat16: the copies of a layer
    computing in bfloat16, `low_precision`), each product's operands per step, and each product comes
    back in the inputs' dtype; the cell state, the gates' element-wise math and the clipping stay in it (the
    projected state `h`, a product, is float32 holding bfloat16's precision). On CPUs with
    AVX512_BF16 (and GPUs) a bfloat16 matmul runs at about twice the float32 rate; a layer at the original shapes
    trained 1.7x as fast here. Products are rounded to the nearest bfloat16 (8 significant bits, relative 2^-9), so
    values and gradients differ from float32 by about 0.5% of their scale
    (tests/layers/backends/test_tensorflow_recurrence.py). Where
    TF's bfloat16 matmul truncates instead (CPUs without AVX-512, where Eigen runs it, or `TF_ENABLE_ONEDNN_OPTS=0`),
    the same roundings are made in float32 (`matmul_precision.rounds_to_nearest`): the same numbers on every CPU, at
    float32's speed there.

    Same arguments as `projected_lstm_scan` (no `chunk`). Returns D outputs `(time, batch, projection_dim)`,
    D final c `(batch, units)`, D final h `(batch, projection_dim)`.
    """
    num = len(inputs)
    mask = tf.convert_to_tensor(mask)
    fresh = None if resets is None else tf.stack([tf.convert_to_tensor(r) for r in resets], axis=1)[:, :, None, :]
    groups = (inputs, input_kernels, biases, recurrent_kernels, projection_kernels, initial_c, initial_h)
    flat = [tf.convert_to_tensor(t) for group in groups for t in group]

    @tf.custom_gradient
    def scan(*flat):
        run = _TrainingScan(
            *(list(flat[k * num : (k + 1) * num]) for k in range(len(groups))),
            mask=mask,
            fresh=fresh,
            clips=(cell_clip, proj_clip),
            matmul_dtype=matmul_dtype,
        )
        return run.forward(), run.gradient

    results = scan(*flat)
    return list(results[:num]), list(results[num : 2 * num]), list(results[2 * num :])


class _TrainingScan:
    """One call of `fast_gradient_scan` (the design is in its docstring): the constants of its loops, made once per
    call (sizes, dtypes, kernels reordered to `(i, f, o, j)` rows and cast to the matmul dtype, the input gates of all
    steps, the masks broadcast to the shapes they select in), the forward loop, and the custom gradient.

    State is `(D, features, batch)`: the D directions stacked, feature-major. `forward` runs first and keeps what the
    gradient reads; `gradient` is the `tf.custom_gradient` backward function of the flat inputs."""

    def __init__(self, xs, w_xs, bs, w_hs, w_ps, c0s, h0s, mask, fresh, clips, matmul_dtype):
        self.num = num = len(xs)
        self.steps, self.batch = steps, batch = tf.shape(mask)[0], tf.shape(mask)[1]
        self.units, self.proj = units, proj = tf.shape(w_ps[0])[1], tf.shape(w_ps[0])[0]
        self.dtype = xs[0].dtype
        low = tf.dtypes.as_dtype(matmul_dtype) if matmul_dtype else self.dtype
        # where this device's `low` matmul does not round to nearest (x86 without oneDNN's bfloat16: it truncates),
        # the same numbers in float32: operands and products rounded to `low` (elmo_tf/layers/matmul_precision.py)
        self.rounding = None if rounds_to_nearest(low) else low
        self.mm = self.dtype if self.rounding else low
        self.cell_clip, self.proj_clip = clips
        self.x_shapes = [tf.shape(x) for x in xs]
        self.w_xs = [_gates_last(self.lo(w)) for w in w_xs]  # (4 * units, in), rows (i, f, o, j)
        self.w_hs = [_gates_last(self.lo(w)) for w in w_hs]  # (4 * units, projection_dim)
        self.w_ps = [self.lo(w) for w in w_ps]
        forget = tf.constant([[0.0], [FORGET_BIAS], [0.0], [0.0]], self.dtype)
        bs = [tf.reshape(tf.reshape(_gates_last(b), [4, units]) + forget, [-1, 1]) for b in bs]
        self.xs = [self.lo(tf.reshape(x, [steps * batch, tf.shape(x)[-1]])) for x in xs]
        gates = []
        for x, w_x, b in zip(self.xs, self.w_xs, bs):
            z = self.hi(tf.matmul(w_x, x, transpose_b=True)) + b
            gates.append(tf.reshape(z, [4, units, steps, batch]))
        self.gates = tf.transpose(tf.stack(gates), [3, 1, 0, 2, 4])  # (time, 4, D, units, batch)
        self.c0 = tf.stack([tf.transpose(c) for c in c0s])  # (D, units, batch)
        self.h0 = tf.stack([tf.transpose(h) for h in h0s])  # (D, projection_dim, batch)
        self.zeros_c, self.zeros_h = tf.zeros_like(self.c0), tf.zeros_like(self.h0)  # once, not a fill per step
        self.keep_c = tf.broadcast_to(mask[:, None, None, :], [steps, num, units, batch])
        self.keep_h = tf.broadcast_to(mask[:, None, None, :], [steps, num, proj, batch])
        self.fresh_c = self.fresh_h = None
        if fresh is not None:
            self.fresh_c = tf.broadcast_to(fresh, [steps, num, units, batch])
            self.fresh_h = tf.broadcast_to(fresh, [steps, num, proj, batch])

    def lo(self, t):
        """A matmul's operand, in the matmul dtype (tf.cast to the same dtype is no op), or rounded to it (a kernel
        given in bfloat16, a layer's copy, widened first)."""
        return round_to(tf.cast(t, self.dtype), self.rounding) if self.rounding else tf.cast(t, self.mm)

    def hi(self, t):
        """A matmul's product, back in the state's dtype (rounded to the matmul dtype where that is emulated)."""
        return round_to(t, self.rounding) if self.rounding else tf.cast(t, self.dtype)

    def array(self, like):
        return tf.TensorArray(like.dtype, size=self.steps, element_shape=like.shape)

    def forward(self):
        """Runs the forward loop; returns D outputs `(time, batch, projection_dim)`, D final c, D final h."""
        c0, h0 = self.c0, self.h0
        # sigmoids, tanh(j), c_in, c_raw, h_in, m_raw, r
        saved = tuple(self.array(t) for t in (tf.stack([c0, c0, c0]), c0, c0, c0, self.lo(h0), h0, self.lo(c0)))
        _, c, h, saved = tf.while_loop(lambda t, *_: t < self.steps, self.forward_step, (tf.constant(0), c0, h0, saved))
        self.sigs, self.js, self.c_ins, self.c_raws, h_ins, m_raws, self.rs = saved
        self.h_ins, self.m_raws = h_ins.stack(), m_raws.stack()  # (time, D, projection_dim, batch)
        m_all = _clip(self.m_raws, self.proj_clip)
        out = tf.transpose(tf.where(self.keep_h, m_all, tf.zeros_like(m_all)), [1, 0, 3, 2])  # (D, time, batch, proj)
        self.results = (
            tf.unstack(out)  # D x (time, batch, projection_dim)
            + [tf.transpose(c[d]) for d in range(self.num)]
            + [tf.transpose(h[d]) for d in range(self.num)]
        )
        return self.results

    def forward_step(self, t, c, h, saved):
        """Step t of the forward loop: the cell on all directions at once; saves what `backward_step` reads."""
        num, units, batch = self.num, self.units, self.batch
        if self.fresh_c is not None:
            c = tf.where(self.fresh_c[t], self.zeros_c, c)
            h = tf.where(self.fresh_h[t], self.zeros_h, h)
        h_l = self.lo(h)
        z = self.gates[t] + self.hi(
            tf.stack([tf.reshape(tf.matmul(self.w_hs[d], h_l[d]), [4, units, batch]) for d in range(num)], 1)
        )
        sig, j = tf.sigmoid(z[:3]), tf.tanh(z[3])
        i, f, o = tf.unstack(sig)
        c_raw = f * c + i * j
        c_new = _clip(c_raw, self.cell_clip)
        r = self.lo(o * tf.tanh(c_new))
        m_raw = self.hi(tf.stack([tf.matmul(self.w_ps[d], r[d]) for d in range(num)]))
        m = _clip(m_raw, self.proj_clip)
        saved = tuple(a.write(t, v) for a, v in zip(saved, (sig, j, c, c_raw, h_l, m_raw, r)))
        return t + 1, tf.where(self.keep_c[t], c_new, c), tf.where(self.keep_h[t], m, h), saved

    def gradient(self, *upstream):
        """The custom gradient: the flat inputs' gradients from those of the outputs and final states (None: 0)."""
        num, results = self.num, self.results
        d_out = tf.stack([_zeros_if_none(g, y) for g, y in zip(upstream[:num], results[:num])])
        d_out = tf.transpose(d_out, [1, 0, 3, 2])  # (time, D, projection_dim, batch)
        dc = tf.stack([tf.transpose(_zeros_if_none(g, y)) for g, y in zip(upstream[num : 2 * num], results[num:])])
        dh = tf.stack([tf.transpose(_zeros_if_none(g, y)) for g, y in zip(upstream[2 * num :], results[2 * num :])])
        self.w_hs_t = [tf.transpose(w) for w in self.w_hs]  # (projection_dim, 4 * units), once per call
        self.w_ps_t = [tf.transpose(w) for w in self.w_ps]  # (units, projection_dim)
        keep_m = self.keep_h & _clip_passes(self.m_raws, self.proj_clip) if self.proj_clip else self.keep_h

        def back(k, dc, dh, d_zs, d_ms):
            return self.backward_step(d_out, keep_m, k, dc, dh, d_zs, d_ms)

        d_zs, d_ms = self.array(self.lo(tf.stack([self.c0] * 4, axis=1))), self.array(self.lo(self.h0))
        _, dc, dh, d_zs, d_ms = tf.while_loop(lambda k, *_: k < self.steps, back, (tf.constant(0), dc, dh, d_zs, d_ms))
        grads = self.weight_gradients(d_zs.stack(), d_ms.stack())
        return (
            grads["x"]
            + grads["w_x"]
            + grads["b"]
            + grads["w_h"]
            + grads["w_p"]
            + [tf.transpose(dc[d]) for d in range(num)]
            + [tf.transpose(dh[d]) for d in range(num)]
        )

    def backward_step(self, d_out, keep_m, k, dc, dh, d_zs, d_ms):
        """Step k of the backward loop (time t = steps - 1 - k): the state gradients carried to step t - 1, and the
        gate gradient `dz` and projection gradient `dm` of step t, stored for `weight_gradients`."""
        num, batch, lo, hi = self.num, self.batch, self.lo, self.hi
        t = self.steps - 1 - k
        sig = self.sigs.read(t)
        i, f, o = tf.unstack(sig)
        j, c_raw = self.js.read(t), self.c_raws.read(t)
        tanh_c = tf.tanh(_clip(c_raw, self.cell_clip))
        dm = lo(tf.where(keep_m[t], dh + d_out[t], self.zeros_h))
        dr = hi(tf.stack([tf.matmul(self.w_ps_t[d], dm[d]) for d in range(num)]))  # (D, units, batch)
        dcell = tf.where(self.keep_c[t], dc + dr * (o * (1.0 - tanh_c * tanh_c)), self.zeros_c)
        if self.cell_clip:
            dcell = tf.where(_clip_passes(c_raw, self.cell_clip), dcell, self.zeros_c)
        d_i, d_f, d_o = tf.unstack(sig * (1.0 - sig))
        dz = lo(
            tf.stack(  # (D, 4, units, batch): each direction's matmul reads one contiguous slice
                [dcell * j * d_i, dcell * self.c_ins.read(t) * d_f, dr * tanh_c * d_o, dcell * i * (1.0 - j * j)],
                axis=1,
            )
        )
        dc_in = tf.where(self.keep_c[t], dcell * f, dc)
        dh_in = tf.where(
            self.keep_h[t],
            hi(tf.stack([tf.matmul(self.w_hs_t[d], tf.reshape(dz[d], [-1, batch])) for d in range(num)])),
            dh,
        )
        if self.fresh_c is not None:
            dc_in = tf.where(self.fresh_c[t], self.zeros_c, dc_in)
            dh_in = tf.where(self.fresh_h[t], self.zeros_h, dh_in)
        return k + 1, dc_in, dh_in, d_zs.write(t, dz), d_ms.write(t, dm)

    def weight_gradients(self, d_zs, d_ms):
        """The input and weight gradients as a few matmuls over all steps at once, from the gate gradients `d_zs`
        `(time, D, 4, units, batch)` and projection gradients `d_ms` `(time, D, projection_dim, batch)`: dict of D
        tensors each for "x", "w_x", "b", "w_h", "w_p", in the weights' stored row order `(i, j, f, o)`."""
        num, units, proj, hi = self.num, self.units, self.proj, self.hi
        d_zs = tf.unstack(tf.reshape(tf.transpose(d_zs, [1, 2, 3, 0, 4]), [num, 4 * units, -1]))
        d_ms = tf.unstack(tf.reshape(tf.transpose(d_ms, [1, 2, 0, 3]), [num, proj, -1]))
        h_in = tf.unstack(tf.reshape(tf.transpose(self.h_ins, [1, 2, 0, 3]), [num, proj, -1]))
        r = tf.unstack(tf.reshape(tf.transpose(self.rs.stack(), [1, 2, 0, 3]), [num, units, -1]))
        low = self.mm != self.dtype
        ones = tf.ones([self.steps * self.batch, 1], self.mm) if low else None
        grads = {name: [] for name in ("x", "w_x", "b", "w_h", "w_p")}
        for d in range(num):
            d_z = d_zs[d]  # (4 * units, time * batch), rows (i, f, o, j)
            grads["x"].append(tf.reshape(hi(tf.matmul(d_z, self.w_xs[d], transpose_a=True)), self.x_shapes[d]))
            grads["w_x"].append(hi(_gates_back(tf.matmul(d_z, self.xs[d]))))
            # bias: a sum over all steps; a matmul accumulates in float32 where a bfloat16 reduce_sum would not
            d_b = tf.reshape(tf.matmul(d_z, ones), [-1]) if low else tf.reduce_sum(d_z, axis=1)
            grads["b"].append(hi(_gates_back(d_b)))
            grads["w_h"].append(hi(_gates_back(tf.matmul(d_z, h_in[d], transpose_b=True))))
            grads["w_p"].append(hi(tf.matmul(d_ms[d], r[d], transpose_b=True)))
        return grads
