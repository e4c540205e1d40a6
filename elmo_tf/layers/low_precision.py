"""The matmuls and convolutions of a layer that computes in bfloat16 (`precision="bfloat16"`, issue 51), on every
backend.

Such a layer multiplies bfloat16 operands with float32 accumulation: the product comes back float32, holding a
bfloat16 number (TensorFlow's, JAX's and PyTorch's bfloat16 matmuls round their result to bfloat16), and everything
around the products (biases, activations, the gates, the cell state, clipping, every output) stays float32.

Weights: a layer's float32 variables stay its weights (saved, trained, converted, fingerprinted); `kernel_copies` gives
their bfloat16 operands:
- TensorFlow: copies held in variables, converted when the layer is built and again only after its weights changed
  (any Keras `variable.assign`: loading, `set_weights`; a gradient taken through them; `weights_changed`), never per
  step nor per call of an unchanged model (`backends.tensorflow_precision.KernelCopies`);
- JAX, PyTorch: cast once per call (outside any loop), as the weights live in the backend's own state there.

Where this process's TensorFlow bfloat16 op does not round its result to nearest (the matmul on x86 CPUs without
AVX-512, where Eigen truncates: `matmul_precision`), `matmul` and `conv1d` compute the same numbers in float32: the
operands widened (exact) or rounded to bfloat16, a float32 op, the result rounded to bfloat16. Such a CPU has no
bfloat16 unit: `precision="auto"` never picks bfloat16 there (`elmo_tf.precision`).

This module imports no TensorFlow off the TensorFlow backend (`_tensorflow`, the pattern of the door
`elmo_tf.layers.backends`).
"""

import keras
from keras import ops

from elmo_tf.backend import is_tensorflow_backend
from elmo_tf.precision import check_precision, resolve_precision

LOW = "bfloat16"  # the dtype of a bfloat16 layer's matmul operands
HOLDER = "_low_precision"  # the attribute of a layer holding its `kernel_copies`


def _tensorflow():
    """`backends.tensorflow_precision` on the TensorFlow backend; `NotImplementedError` on any other."""
    if not is_tensorflow_backend():
        raise NotImplementedError(f"no TensorFlow path on the {keras.config.backend()!r} backend")
    from elmo_tf.layers.backends import tensorflow_precision

    return tensorflow_precision


def layer_precision(precision):
    """`(requested, computed)` of a layer's `precision` argument: the value its config stores (one of
    `elmo_tf.precision.PRECISIONS`) and the one it computes in ("float32" or "bfloat16"; "auto" resolved once per
    process). A bad value: `PrecisionError` naming `precision`."""
    requested = "float32" if precision is None else check_precision(precision)
    return requested, resolve_precision(requested)


def emulated(op="matmul"):
    """Whether this process computes a bfloat16 `op` ("matmul" or "conv") in float32 with rounded operands and result,
    because the backend's own does not round to nearest (TensorFlow's matmul where Eigen runs it). False off
    TensorFlow."""
    try:
        return _tensorflow().emulated(op)
    except NotImplementedError:
        return False


def round_to_low(x):
    """float32 `x` rounded to the nearest bfloat16 number (ties to even), kept float32."""
    return ops.cast(ops.cast(x, LOW), x.dtype)


def _product(y, dtype):
    """An op's result in `dtype` (float32): cast from bfloat16, or rounded where the op ran in float32."""
    return ops.cast(y, dtype) if keras.backend.standardize_dtype(y.dtype) == LOW else round_to_low(y)


def _is_low(x):
    return keras.backend.standardize_dtype(x.dtype) == LOW


def _operands(a, w, op):
    """`(a, w)` in the form the op runs on here: both bfloat16, or both float32 holding bfloat16 values (`w` given
    in float32 is taken as holding bfloat16 values already: `loop_operand`'s form where the op is emulated)."""
    if not _is_low(w):
        return (ops.cast(a, "float32") if _is_low(a) else round_to_low(a)), w
    if emulated(op):
        return (ops.cast(a, "float32") if _is_low(a) else round_to_low(a)), ops.cast(w, "float32")
    return ops.cast(a, LOW), w


def loop_operand(w, op="matmul"):
    """A weight as a loop holds it for its many matmuls, made once before the loop: bfloat16, or where the op is
    emulated, float32 holding the bfloat16 values (widened from a bfloat16 copy, or rounded from float32 weights).
    `matmul` takes it as it is."""
    if emulated(op):
        return ops.cast(w, "float32") if _is_low(w) else round_to_low(w)
    return ops.cast(w, LOW)


def matmul(a, w, dtype="float32"):
    """`a @ w` in bfloat16 with float32 accumulation: float32 (or bfloat16) `a (..., k)`, `w (k, n)` (a layer's
    bfloat16 copy, or `loop_operand`'s form) -> `dtype` `(..., n)`, the product rounded to bfloat16."""
    a, w = _operands(a, w, "matmul")
    return _product(ops.matmul(a, w), dtype)


def conv1d(x, kernel, dtype="float32"):
    """A VALID, stride-1 convolution over axis 1 in bfloat16 with float32 accumulation: `x (n, positions, channels)`
    (float32 or bfloat16), `kernel (width, channels, filters)` -> `dtype` `(n, positions - width + 1, filters)`, the
    result rounded to bfloat16."""
    x, kernel = _operands(x, kernel, "conv")
    try:
        y = _tensorflow().conv1d(x, kernel)
    except NotImplementedError:
        y = ops.conv(x, kernel, strides=1, padding="valid", data_format="channels_last")
    return _product(y, dtype)


class CastPerCall:
    """`kernel_copies` off TensorFlow: the weights cast to bfloat16 at every `read` (once per call of the layer; the
    variables live in the backend's state, so a copy held here would go stale under `jax.jit`)."""

    def __init__(self, variables):
        self.sources = list(variables)

    def read(self):
        return [ops.cast(v, LOW) for v in self.sources]

    def changed(self):
        """Nothing is held."""

    def refresh(self):
        """Nothing is held."""


def kernel_copies(variables, name):
    """The bfloat16 operands of `variables` (a layer's float32 weights): an object whose `read()` returns them
    in order, `changed()` marks them stale (converted again at the next read) and `refresh()` converts them now
    (eagerly). On TensorFlow, `backends.tensorflow_precision.KernelCopies`; elsewhere, `CastPerCall`."""
    try:
        return _tensorflow().KernelCopies(variables, name)
    except NotImplementedError:
        return CastPerCall(variables)


def attach(layer, variables):
    """Gives `layer` (computing in bfloat16) the `kernel_copies` of `variables`; nothing for a float32 layer."""
    if layer.precision == LOW:
        setattr(layer, HOLDER, kernel_copies(variables, layer.name))


def read(layer):
    """The bfloat16 operands of `layer`'s attached kernels (`attach`), in order; their gradients go to the float32
    variables."""
    return getattr(layer, HOLDER).read()


def _holders(layer):
    found = []
    for sub in layer._flatten_layers(include_self=True, recursive=True):
        holder = getattr(sub, HOLDER, None)
        if holder is not None:
            found.append(holder)
    return found


def weights_changed(layer):
    """Marks the bfloat16 copies of `layer` and of every layer inside it stale: they are converted again at the next
    call. Only for code that writes the underlying `tf.Variable`s itself (`variable.value.assign`, a slice's assign):
    a Keras `variable.assign` (Keras's loading, `set_weights`, `elmo_tf.io`'s weight loaders) marks them already."""
    for holder in _holders(layer):
        holder.changed()


def refresh(layer):
    """Converts the bfloat16 copies of `layer` and of every layer inside it now, eagerly (after loading weights: an
    export then holds copies that are up to date, and no call converts them)."""
    for holder in _holders(layer):
        holder.refresh()


__all__ = [
    "LOW",
    "attach",
    "conv1d",
    "emulated",
    "kernel_copies",
    "layer_precision",
    "loop_operand",
    "matmul",
    "read",
    "refresh",
    "round_to_low",
    "weights_changed",
]
