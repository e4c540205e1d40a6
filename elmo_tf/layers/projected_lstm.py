"""One direction of one biLM layer: an LSTM with a projected output (TF1 `LSTMCell(num_proj=...)`)."""

import keras
import numpy as np
import tensorflow as tf

from elmo_tf.layers.recurrence import projected_lstm_scan

KERNEL_LAYOUT_KEY = "kernel_layout"  # in a .keras file's variables of this layer: the kernels are stored transposed


def _check_clip(name, value):
    if value is not None and (not isinstance(value, (int, float)) or value < 0):
        raise ValueError(f"{name} must be None or a non-negative number, got {value!r}")
    return float(value) if value else None


@keras.saving.register_keras_serializable(package="elmo_tf")
class ProjectedLSTM(keras.layers.Layer):
    """LSTM with projection and clipping, as in bilm-tf: `c = clip(sigmoid(f + 1) c' + sigmoid(i) tanh(j))`,
    `m = clip((sigmoid(o) tanh(c)) W_P)`, gates `z = x W_x + m' W_h + b` in i, j, f, o order.

    The forget bias +1 is added at run time and is not part of `bias` (the weight files' convention).
    The input-to-gates products of many time steps are computed in one matmul; only the recurrent part
    runs per step, in a compiled loop. Stateless by default: zero initial state.

    Weights are stored in the orientation of the step's feature-major matmuls (`W^T h`), transposed from the
    weight files': `input_kernel` `(4 * units, input_dim)` = `W_x^T`, `recurrent_kernel`
    `(4 * units, projection_dim)` = `W_h^T`, `projection_kernel` `(projection_dim, units)` = `W_P^T`, so no call
    copies them (a transposed copy of the original's kernels is 144 MB per layer). `.keras` files written before
    (kernels as in the weight files) are recognized and transposed when loaded.

    Args:
        units: cell size (bilm-tf's `lstm.dim`, 4096 in the original).
        projection_dim: output size (512 in the original).
        cell_clip, proj_clip: clip values, None (or 0) for no clipping.
        go_backwards: read each sequence from its last real token back to its first (by its mask);
            outputs are returned in forward order.
        return_state: also return the final `[c, h]` (state after each row's last real token).
        dropout: rate applied to the inputs in training (no recurrent dropout, as in the original).
    Call arguments:
        inputs: float `(batch, time, input_dim)`.
        mask: bool `(batch, time)`, True for real steps (left-aligned), or None for all real.
        initial_state: optional `[c (batch, units), h (batch, projection_dim)]`.
    Returns:
        float `(batch, time, projection_dim)` (zeros at masked steps), and `[c, h]` with `return_state`.
    """

    def __init__(
        self,
        units,
        projection_dim,
        cell_clip=None,
        proj_clip=None,
        go_backwards=False,
        return_state=False,
        dropout=0.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        for name, value in (("units", units), ("projection_dim", projection_dim)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        self.units = units
        self.projection_dim = projection_dim
        self.cell_clip = _check_clip("cell_clip", cell_clip)
        self.proj_clip = _check_clip("proj_clip", proj_clip)
        self.go_backwards = bool(go_backwards)
        self.return_state = bool(return_state)
        self.dropout = float(dropout)
        self.supports_masking = True

    def build(self, input_shape):
        input_dim = input_shape[-1]
        if input_dim is None:
            raise ValueError(f"ProjectedLSTM needs a known input dimension, got input shape {input_shape}")
        # transposed storage (see the class docstring); glorot and orthogonal are symmetric in the two axes
        self.input_kernel = self.add_weight(
            name="input_kernel", shape=(4 * self.units, input_dim), initializer="glorot_uniform"
        )
        self.recurrent_kernel = self.add_weight(
            name="recurrent_kernel", shape=(4 * self.units, self.projection_dim), initializer="orthogonal"
        )
        self.bias = self.add_weight(name="bias", shape=(4 * self.units,), initializer="zeros")
        self.projection_kernel = self.add_weight(
            name="projection_kernel", shape=(self.projection_dim, self.units), initializer="glorot_uniform"
        )

    def save_own_variables(self, store):
        super().save_own_variables(store)
        store[KERNEL_LAYOUT_KEY] = np.array([1], np.int32)  # marks the transposed storage

    def load_own_variables(self, store):
        """Loads `.keras` weights; files without the layout mark (written before the kernels were stored transposed)
        get their 2-D kernels transposed."""
        variables = self._trainable_variables + self._non_trainable_variables
        transposed = KERNEL_LAYOUT_KEY in store
        found = len(store.keys()) - int(transposed)
        if found != len(variables):
            raise ValueError(f"layer {self.name!r} expects {len(variables)} variables, the file holds {found}")
        for i, variable in enumerate(variables):
            value = np.asarray(store[f"{i}"])
            if not transposed and value.ndim == 2:
                value = value.T
            variable.assign(value)

    def dropped(self, x, training=None):
        """The inputs with this layer's dropout applied (in training only)."""
        if training and self.dropout > 0:
            return tf.nn.dropout(x, rate=self.dropout)
        return x

    def kernels(self):
        """`(input_kernel, bias, recurrent_kernel, projection_kernel)` as tensors, in `projected_lstm_scan`'s order."""
        return [
            tf.convert_to_tensor(w)
            for w in (self.input_kernel, self.bias, self.recurrent_kernel, self.projection_kernel)
        ]

    def zero_state(self, batch_size, dtype=tf.float32):
        return [tf.zeros([batch_size, self.units], dtype), tf.zeros([batch_size, self.projection_dim], dtype)]

    def call(self, inputs, mask=None, initial_state=None, training=None):
        x = tf.convert_to_tensor(inputs)
        if x.shape.rank != 3 or not x.dtype.is_floating:
            raise ValueError(f"ProjectedLSTM inputs must be float (batch, time, dim), got {x.dtype.name} {x.shape}")
        if mask is None:
            mask = tf.ones(tf.shape(x)[:2], tf.bool)
        mask = tf.cast(mask, tf.bool)
        mask_tm = tf.transpose(mask)
        x_tm = tf.transpose(x, [1, 0, 2])
        lengths = tf.reduce_sum(tf.cast(mask_tm, tf.int32), axis=0)
        if self.go_backwards:
            x_tm = tf.reverse_sequence(x_tm, lengths, seq_axis=0, batch_axis=1)
        if initial_state is None:
            initial_state = self.zero_state(tf.shape(x)[0], x.dtype)
        w_x, bias, w_h, w_p = self.kernels()
        (out,), (c,), (h,) = projected_lstm_scan(
            [self.dropped(x_tm, training)],
            mask_tm,
            [w_x],
            [bias],
            [w_h],
            [w_p],
            [initial_state[0]],
            [initial_state[1]],
            self.cell_clip,
            self.proj_clip,
        )
        out.set_shape([None, None, self.projection_dim])  # the compiled loop may relax static dims
        if self.go_backwards:
            out = tf.reverse_sequence(out, lengths, seq_axis=0, batch_axis=1)
        out = tf.transpose(out, [1, 0, 2])
        return (out, [c, h]) if self.return_state else out

    def compute_mask(self, inputs, mask=None):
        return None if self.return_state else mask

    def compute_output_shape(self, input_shape):
        out = tuple(input_shape[:-1]) + (self.projection_dim,)
        if self.return_state:
            return out, [(input_shape[0], self.units), (input_shape[0], self.projection_dim)]
        return out

    def get_config(self):
        config = super().get_config()
        config.update(
            units=self.units,
            projection_dim=self.projection_dim,
            cell_clip=self.cell_clip,
            proj_clip=self.proj_clip,
            go_backwards=self.go_backwards,
            return_state=self.return_state,
            dropout=self.dropout,
        )
        return config
