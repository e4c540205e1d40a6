"""The bidirectional LM of ELMo: separate forward and backward stacks of projected LSTMs."""

import keras
from keras import ops

from elmo_tf.layers import low_precision
from elmo_tf.layers.lstm_constants import MATMUL_DTYPES
from elmo_tf.layers.ops_recurrence import reverse_sequences
from elmo_tf.layers.projected_lstm import IMPLEMENTATIONS, ProjectedLSTMCell, check_implementation, run_cells

__all__ = ["BiLM", "DIRECTIONS", "IMPLEMENTATIONS", "MATMUL_DTYPES"]

DIRECTIONS = ("forward", "backward")


@keras.saving.register_keras_serializable(package="elmo_tf")
class BiLM(keras.layers.Layer):
    """Forward and backward LSTM stacks over the same token vectors; layer l>0 adds its input (residual).

    The forward stack reads each sentence left to right, the backward stack from its last real token
    back to its first (as `tf.reverse_sequence` with the true lengths); the stacks never feed each
    other. Both directions of a layer advance in one compiled loop (`projected_lstm.run_cells`). With
    `use_skip_connections`, layer l>0 outputs `lstm_l(x) + x`; the recurrent state is the LSTM's own output.

    Sublayers: one `ProjectedLSTMCell` per direction and layer, `forward_lstm_{l}`, `backward_lstm_{l}` (stable
    names, used by the weight converter; `get_lstm`).

    Args:
        num_layers: LSTM layers per direction.
        units: LSTM cell size.
        projection_dim: LSTM output size (and the token vector size).
        cell_clip: clip value of the LSTM cell state, or None.
        proj_clip: clip value of the projected output, or None.
        use_skip_connections: residual connections from layer 1 on.
        dropout: rate on each layer's input, in training only.
        implementation: the loop, as `keras.layers.LSTM(use_cudnn=)` chooses its own: "auto" (default) runs the
            hand-written backward pass (`backends.tensorflow_recurrence.fast_gradient_scan`: same values; a layer's
            forward + backward 1.3-1.5x as fast, bench/train_throughput.py --profile) in training (`training=True`,
            no `gate_chunk`) and the plain scan otherwise; "scan" always the plain scan, with TF's automatic gradient
            (the reference the fast one is tested against); "fast_gradient" always the hand-written one (no
            `gate_chunk`); "ops" the loop written in `keras.ops` (`ops_recurrence.ops_lstm_scan`), the one loop of the
            JAX and PyTorch backends (where "auto" means it, and "scan" and "fast_gradient" are refused).
        matmul_dtype: None, "float32" or "bfloat16": the dtype of the matmuls of `fast_gradient_scan`, where it runs
            (with "auto": training only; not with "scan"); the weights, the cell state and the element-wise math
            stay float32, the products (and so the outputs) hold bfloat16's precision. With "auto", inference and
            evaluation run float32; with "ops", every call runs the matmuls in this dtype (a GPU's bfloat16 inference).
        precision: "float32" (default: the original numbers), "bfloat16" or "auto" (`elmo_tf.precision`): with
            bfloat16 every call (inference and training, every `implementation`) runs the input, recurrent and
            projection matmuls on bfloat16 copies of the kernels, converted once (`low_precision`), with float32
            accumulation; gates, cell state, clipping and outputs stay float32. `matmul_dtype` may then be None
            or "bfloat16". The attribute `precision` is the computed one ("auto" resolved).
    Call arguments:
        inputs: float `(batch, time, projection_dim)` token vectors.
        mask: bool `(batch, time)`, True for real tokens (left-aligned). None: all real.
        initial_state: optional flat list of `4 * num_layers` tensors, ordered
            `[c, h]` of forward layer 0, 1, ..., then backward layer 0, 1, ...; zeros when None.
        return_state: also return the final states in the same order (after each row's last real
            token; for the backward stack, after its first token).
        segment_starts: optional bool `(batch, time)`, True where a new sequence starts inside a row (packed
            rows: `<S> a b </S> <S> c </S>`). Both stacks start each segment from the zero state (the forward
            one at its first step, the backward one at its last), so every segment gets exactly the outputs it
            gets alone in a row; `initial_state` then applies to the row's first segment only.
        gate_chunk: optional python int: compute the input gates this many steps at a time (bounds their
            memory to `gate_chunk` steps; default: all steps in one matmul).
    Returns:
        list of `num_layers` float `(batch, time, 2 * projection_dim)` (forward ++ backward, zeros at
        padding); with `return_state`, `(outputs, states)`.
    """

    def __init__(
        self,
        num_layers=2,
        units=4096,
        projection_dim=512,
        cell_clip=3.0,
        proj_clip=3.0,
        use_skip_connections=True,
        dropout=0.0,
        implementation="auto",
        matmul_dtype=None,
        precision="float32",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.requested_precision, self.precision = low_precision.layer_precision(precision)
        for name, value in (("num_layers", num_layers), ("units", units), ("projection_dim", projection_dim)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.num_layers = num_layers
        self.units = units
        self.projection_dim = projection_dim
        self.cell_clip = cell_clip
        self.proj_clip = proj_clip
        self.use_skip_connections = bool(use_skip_connections)
        self.dropout = dropout
        self.implementation, self.matmul_dtype = check_implementation(implementation, matmul_dtype, self.precision)
        self.supports_masking = True

    def build(self, input_shape):
        if input_shape[-1] is not None and input_shape[-1] != self.projection_dim:
            raise ValueError(
                f"BiLM inputs must have last dimension projection_dim={self.projection_dim}, "
                f"got input shape {input_shape}"
            )
        self.forward_lstms, self.backward_lstms = [], []
        for direction, stack in zip(DIRECTIONS, (self.forward_lstms, self.backward_lstms)):
            for layer in range(self.num_layers):
                cell = ProjectedLSTMCell(
                    self.units,
                    self.projection_dim,
                    cell_clip=self.cell_clip,
                    proj_clip=self.proj_clip,
                    dropout=self.dropout,
                    precision=self.precision,
                    name=f"{direction}_lstm_{layer}",
                )
                cell.build((None, self.projection_dim))
                stack.append(cell)

    def get_lstm(self, direction, layer):
        """The `ProjectedLSTMCell` of one direction ("forward"/"backward") and layer."""
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
        return (self.forward_lstms if direction == "forward" else self.backward_lstms)[layer]

    def zero_state(self, batch_size, dtype="float32"):
        return [
            s
            for d in DIRECTIONS
            for layer in range(self.num_layers)
            for s in self.get_lstm(d, layer).zero_state(batch_size, dtype)
        ]

    def call(
        self,
        inputs,
        mask=None,
        initial_state=None,
        return_state=False,
        training=None,
        segment_starts=None,
        gate_chunk=None,
    ):
        x = ops.convert_to_tensor(inputs)
        dtype = keras.backend.standardize_dtype(x.dtype)
        if len(x.shape) != 3 or not keras.backend.is_float_dtype(dtype):
            raise ValueError(
                f"BiLM inputs must be float (batch, time, {self.projection_dim}), got {dtype} {tuple(x.shape)}"
            )
        batch = ops.shape(x)[0]
        mask = ops.ones(ops.shape(x)[:2], "bool") if mask is None else ops.cast(mask, "bool")
        mask_tm = ops.transpose(mask)
        lengths = ops.sum(ops.cast(mask_tm, "int32"), axis=0)
        if initial_state is None:
            initial_state = self.zero_state(batch, x.dtype)
        if len(initial_state) != 4 * self.num_layers:
            raise ValueError(
                f"initial_state must hold {4 * self.num_layers} tensors ([c, h] per direction and "
                f"layer), got {len(initial_state)}"
            )
        x_tm = ops.transpose(x, (1, 0, 2))

        def reverse(t):
            return reverse_sequences(t, lengths)

        # the backward stack works in reversed time throughout; its outputs are restored at the end
        stream = {"forward": x_tm, "backward": reverse(x_tm)}
        resets = None
        if segment_starts is not None:
            starts = ops.logical_and(ops.transpose(ops.cast(segment_starts, "bool")), mask_tm)  # (time, batch)
            # a segment ends where the next step starts another one or is padding
            after = ops.logical_or(starts[1:], ops.logical_not(mask_tm[1:]))
            ends = ops.logical_and(mask_tm, ops.concatenate([after, ops.ones_like(starts[:1])], axis=0))
            resets = [starts, reverse(ends)]
        outputs, final_states = [], {}
        for layer in range(self.num_layers):
            state_index = [(k * self.num_layers + layer) * 2 for k in range(len(DIRECTIONS))]
            outs, cs, hs = run_cells(
                [self.get_lstm(d, layer) for d in DIRECTIONS],
                [stream[d] for d in DIRECTIONS],
                mask_tm,
                [initial_state[i] for i in state_index],
                [initial_state[i + 1] for i in state_index],
                resets=resets,
                training=training,
                implementation=self.implementation,
                gate_chunk=gate_chunk,
                matmul_dtype=self.matmul_dtype,
            )
            for k, d in enumerate(DIRECTIONS):
                final_states[d, layer] = [cs[k], hs[k]]
                stream[d] = outs[k] + stream[d] if self.use_skip_connections and layer > 0 else outs[k]
            backward = reverse(stream["backward"])
            both = ops.concatenate([stream["forward"], backward], axis=-1) * ops.cast(mask_tm, x.dtype)[:, :, None]
            outputs.append(ops.transpose(both, (1, 0, 2)))
        if return_state:
            return outputs, [s for d in DIRECTIONS for layer in range(self.num_layers) for s in final_states[d, layer]]
        return outputs

    def compute_output_shape(self, input_shape):
        return [tuple(input_shape[:-1]) + (2 * self.projection_dim,)] * self.num_layers

    def compute_mask(self, inputs, mask=None):
        return [mask] * self.num_layers if mask is not None else None

    def get_config(self):
        config = super().get_config()
        config.update(
            num_layers=self.num_layers,
            units=self.units,
            projection_dim=self.projection_dim,
            cell_clip=self.cell_clip,
            proj_clip=self.proj_clip,
            use_skip_connections=self.use_skip_connections,
            dropout=self.dropout,
            implementation=self.implementation,
            matmul_dtype=self.matmul_dtype,
            precision=self.requested_precision,
        )
        return config
