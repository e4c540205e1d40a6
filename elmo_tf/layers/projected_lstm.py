"""One direction of one biLM layer: an LSTM with a projected output (TF1 `LSTMCell(num_proj=...)`).

As keras/src/layers/rnn/lstm.py pairs `LSTMCell` (weights, one step) with `LSTM` (the loop), this file pairs
`ProjectedLSTMCell` (weights, kernels, one step) with `ProjectedLSTM` (one cell over a sequence). Both `BiLM` and
`ProjectedLSTM` run their cells with `run_cells`, which runs TensorFlow's compiled loops (`backends.projected_lstms`) or
the `keras.ops` one (`ops_recurrence.ops_lstm_scan`) by the layer's `implementation`.
"""

import keras
import numpy as np
from keras import ops

from elmo_tf.layers import backends, low_precision
from elmo_tf.layers.lstm_constants import MATMUL_DTYPES, TENSORFLOW_IMPLEMENTATIONS
from elmo_tf.layers.ops_recurrence import lstm_update, ops_lstm_scan, reverse_sequences
from elmo_tf.precision import PrecisionError

KERNEL_LAYOUT_KEY = "kernel_layout"  # in a .keras file's variables of this layer: the kernels are stored transposed
# the loop `run_cells` runs (a layer argument, like use_cudnn)
IMPLEMENTATIONS = ("auto", "scan", "fast_gradient", "ops")
# the arguments of ProjectedLSTMCell, which ProjectedLSTM takes too and reads through (both configs hold them)
CELL_ARGUMENTS = ("units", "projection_dim", "cell_clip", "proj_clip", "dropout", "precision")
CONFLICTING_MATMUL_DTYPE = "float32"  # what `matmul_dtype` may not say beside precision="bfloat16"


def _check_clip(name, value):
    if value is not None and (not isinstance(value, (int, float)) or value < 0):
        raise ValueError(f"{name} must be None or a non-negative number, got {value!r}")
    return float(value) if value else None


def _legacy_variables(store):
    """The store of a cell's variables in a `.keras` file written before `ProjectedLSTMCell` existed, or None.

    Keras names a layer's group in the file after the attribute holding it, and a layer in a list after its class.
    Before, `BiLM` listed `ProjectedLSTM` layers holding the weights themselves (`.../forward_lstms/projected_lstm_1`,
    now `.../forward_lstms/projected_lstm_cell_1`) and a `ProjectedLSTM` held its weights itself (`.../projected_lstm`,
    now `.../projected_lstm/cell`). Keras hands a layer only its own group, so the old one is found from the path of
    the group it was given (`_h5_entry_path`, a private attribute of Keras's H5 store; without it: None).
    """
    path = getattr(store, "_h5_entry_path", None)
    if not path or not hasattr(store, "get"):
        return None
    head, _, last = path.rpartition("/")
    if last == "cell":
        old = head
    elif last.startswith("projected_lstm_cell"):
        old = f"{head}/projected_lstm{last[len('projected_lstm_cell') :]}"
    else:
        return None
    old_store = store.get(old)
    return old_store if len(old_store.keys()) else None


def check_implementation(implementation, matmul_dtype, precision="float32"):
    """Validates a layer's `implementation` and `matmul_dtype` arguments (see `run_cells`) beside its computed
    `precision`; returns them."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    if matmul_dtype not in MATMUL_DTYPES:
        raise ValueError(f"matmul_dtype must be one of {MATMUL_DTYPES}, got {matmul_dtype!r}")
    try:
        offered = backends.recurrence_implementations()
    except NotImplementedError:
        offered = ()
    if implementation in TENSORFLOW_IMPLEMENTATIONS and implementation not in offered:
        raise ValueError(
            f"implementation {implementation!r} runs on the TensorFlow backend only (Keras runs on "
            f"{keras.config.backend()!r}): use 'auto' or 'ops'"
        )
    if precision == low_precision.LOW and matmul_dtype == CONFLICTING_MATMUL_DTYPE:
        raise PrecisionError(
            f"matmul_dtype {matmul_dtype!r} contradicts precision 'bfloat16' (which runs every matmul in bfloat16): "
            "leave matmul_dtype None",
            key="matmul_dtype",
        )
    if implementation == "scan" and matmul_dtype not in (None, "float32"):
        raise ValueError(
            f"matmul_dtype {matmul_dtype!r} needs implementation 'auto', 'fast_gradient' or 'ops' (the plain scan "
            "multiplies in the inputs' dtype), got implementation 'scan'"
        )
    return implementation, matmul_dtype


def run_cells(
    cells,
    inputs,
    mask,
    initial_c,
    initial_h,
    resets=None,
    training=None,
    implementation="auto",
    gate_chunk=None,
    matmul_dtype=None,
):
    """Runs D `ProjectedLSTMCell`s over time, cell d over stream d, all in one compiled loop: the loop of `BiLM` (the
    two directions of a layer) and of `ProjectedLSTM` (one direction).

    Args:
        cells: D built cells of the same sizes and clips (their kernels, clips and input dropout are used).
        inputs: D float tensors `(time, batch, input_dim)`, time-major, each in its cell's reading order (a
            backward cell's stream already reversed by the true lengths).
        mask: bool `(time, batch)`; where False the state is carried unchanged and the output is 0.
        initial_c, initial_h: D tensors `(batch, units)` and `(batch, projection_dim)`.
        resets: None, or D bool `(time, batch)`: where True a step starts from the zero state (a new segment).
        training: applies the cells' dropout; with "auto", selects the training loop.
        implementation: on the TensorFlow backend (`backends.projected_lstms`), "auto": `fast_gradient_scan` (the
            hand-written backward pass) when `training` is True and there is no `gate_chunk`, else
            `projected_lstm_scan`; "scan": always `projected_lstm_scan` (TF's automatic gradient: the reference the
            other is tested against);
            "fast_gradient": always `fast_gradient_scan` (same values to float rounding; all steps' gates at once, so
            no `gate_chunk`). "ops": `ops_recurrence.ops_lstm_scan` (keras.ops, any backend), what "auto" runs on
            every other backend.
        gate_chunk: python int or None: `projected_lstm_scan`'s `chunk` (TensorFlow's loops only).
        matmul_dtype: `fast_gradient_scan`'s `matmul_dtype` where that loop runs, `ops_lstm_scan`'s where it runs
            with "ops" (with "auto" on another backend: in training only, as on TensorFlow). Cells computing in
            bfloat16 (`precision="bfloat16"`) run every loop, in every call, on their kernels' bfloat16 copies
            (converted once, `low_precision`), whatever `matmul_dtype` says.
    Returns:
        D outputs `(time, batch, projection_dim)`, D final c `(batch, units)`, D final h `(batch, projection_dim)`.
    """
    if gate_chunk is not None and implementation in ("fast_gradient", "ops"):
        raise ValueError(
            f"gate_chunk needs implementation 'auto' or 'scan', got gate_chunk={gate_chunk} with {implementation!r}"
        )
    first = cells[0]
    low = first.precision == low_precision.LOW
    if low:
        matmul_dtype = low_precision.LOW
    w_x, bias, w_h, w_p = zip(*(cell.matmul_kernels() for cell in cells))
    args = (
        [cell.dropped(x, training) for cell, x in zip(cells, inputs)],
        mask,
        list(w_x),
        list(bias),
        list(w_h),
        list(w_p),
        list(initial_c),
        list(initial_h),
        first.cell_clip,
        first.proj_clip,
    )
    try:  # TensorFlow's compiled loops, unless `implementation="ops"`
        return backends.projected_lstms(
            args, first.units, first.projection_dim, resets, training, implementation, gate_chunk, matmul_dtype
        )
    except NotImplementedError:
        pass
    if gate_chunk is not None:
        raise ValueError(
            f"gate_chunk needs implementation 'auto' or 'scan', got gate_chunk={gate_chunk} with {implementation!r} "
            f"on the {keras.config.backend()!r} backend"
        )
    use_matmul_dtype = low or implementation == "ops" or training is True
    return ops_lstm_scan(*args, resets=resets, matmul_dtype=matmul_dtype if use_matmul_dtype else None)


@keras.saving.register_keras_serializable(package="elmo_tf")
class ProjectedLSTMCell(keras.layers.Layer):
    """The weights and one step of an LSTM with projection and clipping, as in bilm-tf:
    `c = clip(sigmoid(f + 1) c' + sigmoid(i) tanh(j))`, `m = clip((sigmoid(o) tanh(c)) W_P)`, gates
    `z = x W_x + m' W_h + b` in i, j, f, o order.

    The forget bias +1 is added at run time and is not part of `bias` (the weight files' convention). `BiLM` holds one
    cell per direction and layer and `ProjectedLSTM` one; both run their cells over whole sequences with
    `run_cells` (input gates of all steps in one matmul, only the recurrent part per step, compiled).
    `call` is one step in the convention of Keras cells, so `keras.layers.RNN(cell)` runs a cell step by step too.

    Weights are stored in the orientation of the loop's feature-major matmuls (`W^T h`), transposed from the weight
    files': `input_kernel` `(4 * units, input_dim)` = `W_x^T`, `recurrent_kernel` `(4 * units, projection_dim)` =
    `W_h^T`, `projection_kernel` `(projection_dim, units)` = `W_P^T`, so no call copies them (a transposed copy of
    the original's kernels is 144 MB per layer). `.keras` files written before (kernels as in the weight files, or
    weights held by a `ProjectedLSTM` before the cell existed) are recognized when loaded.

    Args:
        units: cell size (bilm-tf's `lstm.dim`, 4096 in the original).
        projection_dim: output size (512 in the original).
        cell_clip: clip value of the cell state, None (or 0) for no clipping.
        proj_clip: clip value of the projected output, None (or 0) for no clipping.
        dropout: rate applied to the inputs in training (no recurrent dropout, as in the original).
        precision: "float32" (default), "bfloat16" or "auto" (`elmo_tf.precision`): with bfloat16 the input,
            recurrent and projection matmuls take bfloat16 operands (the kernels' copies, converted once:
            `low_precision`) with float32 accumulation; gates, cell state, clipping and outputs stay float32. The
            attribute `precision` is the computed one.
    Call arguments:
        inputs: float `(batch, input_dim)`, one step.
        states: `[c (batch, units), h (batch, projection_dim)]`.
        training: applies the dropout.
    Returns:
        `(h, [c, h])`: the step's output `h` `(batch, projection_dim)` and the new state.
    """

    def __init__(
        self, units, projection_dim, cell_clip=None, proj_clip=None, dropout=0.0, precision="float32", **kwargs
    ):
        super().__init__(**kwargs)
        self.requested_precision, self.precision = low_precision.layer_precision(precision)
        for name, value in (("units", units), ("projection_dim", projection_dim)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        self.units = units
        self.projection_dim = projection_dim
        self.cell_clip = _check_clip("cell_clip", cell_clip)
        self.proj_clip = _check_clip("proj_clip", proj_clip)
        self.dropout = float(dropout)
        # dropout's random stream on JAX and PyTorch (TensorFlow's loops draw with tf.nn.dropout, as before); only with
        # a dropout, so a model's variables are the same on every backend otherwise
        self.seed_generator = None
        if self.dropout > 0:
            try:
                self.seed_generator = backends.dropout_seed_generator()
            except NotImplementedError:
                self.seed_generator = keras.random.SeedGenerator(name="dropout_seed")

    @property
    def state_size(self):
        return [self.units, self.projection_dim]

    @property
    def output_size(self):
        return self.projection_dim

    def build(self, input_shape):
        input_dim = input_shape[-1]
        if input_dim is None:
            raise ValueError(f"ProjectedLSTMCell needs a known input dimension, got input shape {input_shape}")
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
        low_precision.attach(self, [self.input_kernel, self.recurrent_kernel, self.projection_kernel])

    def save_own_variables(self, store):
        super().save_own_variables(store)
        store[KERNEL_LAYOUT_KEY] = np.array([1], np.int32)  # marks the transposed storage

    def load_own_variables(self, store):
        """Loads `.keras` weights; files without the layout mark (written before the kernels were stored transposed)
        get their 2-D kernels transposed; files written before this cell existed are read from their old group."""
        variables = self._trainable_variables + self._non_trainable_variables
        if not len(store.keys()):
            store = _legacy_variables(store) or store
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
        """The inputs with this cell's dropout applied (in training only)."""
        if not (training and self.dropout > 0):
            return x
        try:
            return backends.dropout(x, self.dropout)
        except NotImplementedError:
            return keras.random.dropout(x, self.dropout, seed=self.seed_generator)

    def kernels(self):
        """`(input_kernel, bias, recurrent_kernel, projection_kernel)` as tensors, in the scans' argument order."""
        weights = (self.input_kernel, self.bias, self.recurrent_kernel, self.projection_kernel)
        try:  # tensors, not the variables Keras's TensorFlow convert_to_tensor gives back
            return backends.read_variables(weights)
        except NotImplementedError:
            return [ops.convert_to_tensor(w) for w in weights]

    def matmul_kernels(self):
        """`kernels()` as the matmuls take them: the float32 kernels, or (precision "bfloat16") their bfloat16 copies
        (the bias stays float32)."""
        if self.precision != low_precision.LOW:
            return self.kernels()
        w_x, w_h, w_p = low_precision.read(self)
        return w_x, self.kernels()[1], w_h, w_p

    def zero_state(self, batch_size, dtype="float32"):
        return [ops.zeros((batch_size, self.units), dtype), ops.zeros((batch_size, self.projection_dim), dtype)]

    def call(self, inputs, states, training=None):
        c, h = states
        w_x, bias, w_h, w_p = self.matmul_kernels()
        low = self.precision == low_precision.LOW
        matmul = low_precision.matmul if low else ops.matmul
        x = self.dropped(ops.convert_to_tensor(inputs), training)
        z = matmul(x, ops.transpose(w_x)) + matmul(h, ops.transpose(w_h)) + bias
        matmul_dtype = low_precision.LOW if low else None
        c, m = lstm_update(z, c, ops.transpose(w_p), self.cell_clip, self.proj_clip, matmul_dtype)
        return m, [c, m]

    def get_config_arguments(self):
        """The values of `CELL_ARGUMENTS` a config holds (the precision asked for, not the computed one)."""
        arguments = {name: getattr(self, name) for name in CELL_ARGUMENTS}
        arguments["precision"] = self.requested_precision
        return arguments

    def get_config(self):
        config = super().get_config()
        config.update(self.get_config_arguments())
        return config


@keras.saving.register_keras_serializable(package="elmo_tf")
class ProjectedLSTM(keras.layers.Layer):
    """A `ProjectedLSTMCell` over a sequence, in one direction: one direction of one biLM layer, run by the same loop
    (`run_cells`) and the same implementations as `BiLM`. Stateless by default: zero initial state.

    Args:
        units: the cell's (see `ProjectedLSTMCell`).
        projection_dim: the cell's.
        cell_clip: the cell's.
        proj_clip: the cell's.
        dropout: the cell's.
        go_backwards: read each sequence from its last real token back to its first (by its mask);
            outputs are returned in forward order.
        return_state: also return the final `[c, h]` (state after each row's last real token).
        implementation: the loop, as `BiLM`'s argument of the same name.
        matmul_dtype: as `BiLM`'s argument of the same name.
        precision: the cell's (`ProjectedLSTMCell`), as `BiLM`'s argument of the same name.
    Call arguments:
        inputs: float `(batch, time, input_dim)`.
        mask: bool `(batch, time)`, True for real steps (left-aligned), or None for all real.
        initial_state: optional `[c (batch, units), h (batch, projection_dim)]`.
        training: dropout, and with `implementation="auto"` the training loop.
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
        implementation="auto",
        matmul_dtype=None,
        precision="float32",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.cell = ProjectedLSTMCell(
            units,
            projection_dim,
            cell_clip,
            proj_clip,
            dropout,
            precision=precision,
            dtype=self.dtype_policy,
            name="projected_lstm_cell",
        )
        self.go_backwards = bool(go_backwards)
        self.return_state = bool(return_state)
        self.implementation, self.matmul_dtype = check_implementation(implementation, matmul_dtype, self.precision)
        self.supports_masking = True

    # the cell's arguments and weights, read through (as keras.layers.LSTM reads its LSTMCell's)
    units = property(lambda self: self.cell.units)
    projection_dim = property(lambda self: self.cell.projection_dim)
    cell_clip = property(lambda self: self.cell.cell_clip)
    proj_clip = property(lambda self: self.cell.proj_clip)
    dropout = property(lambda self: self.cell.dropout)
    precision = property(lambda self: self.cell.precision)
    requested_precision = property(lambda self: self.cell.requested_precision)
    input_kernel = property(lambda self: self.cell.input_kernel)
    recurrent_kernel = property(lambda self: self.cell.recurrent_kernel)
    bias = property(lambda self: self.cell.bias)
    projection_kernel = property(lambda self: self.cell.projection_kernel)

    def build(self, input_shape):
        if input_shape[-1] is None:
            raise ValueError(f"ProjectedLSTM needs a known input dimension, got input shape {input_shape}")
        self.cell.build((None, input_shape[-1]))

    def load_own_variables(self, store):
        """Nothing to load: the variables are the cell's. (In a `.keras` file written before the cell existed this
        layer's group holds them; the cell reads them from there.)"""

    def zero_state(self, batch_size, dtype="float32"):
        return self.cell.zero_state(batch_size, dtype)

    def call(self, inputs, mask=None, initial_state=None, training=None):
        x = ops.convert_to_tensor(inputs)
        dtype = keras.backend.standardize_dtype(x.dtype)
        if len(x.shape) != 3 or not keras.backend.is_float_dtype(dtype):
            raise ValueError(f"ProjectedLSTM inputs must be float (batch, time, dim), got {dtype} {tuple(x.shape)}")
        if mask is None:
            mask = ops.ones(ops.shape(x)[:2], "bool")
        mask_tm = ops.transpose(ops.cast(mask, "bool"))
        x_tm = ops.transpose(x, (1, 0, 2))
        lengths = ops.sum(ops.cast(mask_tm, "int32"), axis=0)
        if self.go_backwards:
            x_tm = reverse_sequences(x_tm, lengths)
        if initial_state is None:
            initial_state = self.zero_state(ops.shape(x)[0], x.dtype)
        (out,), (c,), (h,) = run_cells(
            [self.cell],
            [x_tm],
            mask_tm,
            [initial_state[0]],
            [initial_state[1]],
            training=training,
            implementation=self.implementation,
            matmul_dtype=self.matmul_dtype,
        )
        if self.go_backwards:
            out = reverse_sequences(out, lengths)
        out = ops.transpose(out, (1, 0, 2))
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
        config.update(self.cell.get_config_arguments())
        config.update(
            go_backwards=self.go_backwards,
            return_state=self.return_state,
            implementation=self.implementation,
            matmul_dtype=self.matmul_dtype,
        )
        return config
