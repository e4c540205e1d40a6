"""Matmuls whose operands and products hold a lower precision (bfloat16) than the tensors around them, with the same
rounding on every CPU.

TensorFlow's bfloat16 matmul is not the same operation on every machine. On CPUs where oneDNN runs it (x86 with
AVX-512, native with AVX512_BF16 or AMX), and on GPUs, the products are accumulated in float32 and the result is
rounded to the nearest bfloat16 (relative error at most 2^-9). Where oneDNN does not take it (x86 with AVX2 only, or
`TF_ENABLE_ONEDNN_OPTS=0`), TensorFlow's Eigen kernel accumulates in float32 too but *truncates* the result to
bfloat16 (rounds toward zero: error up to 2^-8, and always of the same sign). Through a recurrence that bias adds
up: a projected LSTM's outputs after a few steps differ from float32 several times as much as with round-to-nearest
(issue 37: 0.29 against 0.02 on a test problem).

`rounds_to_nearest(dtype)` asks the matmul itself, once per process: it multiplies a vector whose exact sum lies
between two bfloat16 numbers, nearer the upper one. Where it does, `low_precision_matmul` and the callers that cast
operands themselves (`fast_gradient_scan`) run the matmul in bfloat16 (the fast path where it exists); where it does
not, the same numbers are computed in float32: operands rounded to bfloat16 (`tf.cast` rounds to nearest even),
a float32 matmul, the product rounded to bfloat16 and kept in float32. On such a CPU the emulated bfloat16 matmul
is no faster than float32 anyway, and this way it is not slower either.

`conv_rounds_to_nearest` asks `tf.nn.conv1d` the same question: on x86 with AVX2 only, oneDNN runs TensorFlow's
bfloat16 convolution (rounding to nearest) while Eigen runs its bfloat16 matmul (truncating), so the two are decided
apart (`elmo_tf.layers.low_precision`, the layers' bfloat16 ops).
"""

import functools
import logging

import tensorflow as tf

log = logging.getLogger(__name__)

# [1, 2^-9, 2^-9, 2^-9] . [1, 1, 1, 1] = 1 + 0.75 * 2^-7: rounded to nearest, 1 + 2^-7; truncated, or accumulated
# in bfloat16 (each partial sum 1 + 2^-9 rounds back to 1), 1.0. Every operand is a bfloat16 number.
_PROBE_ROW = (1.0, 2.0**-9, 2.0**-9, 2.0**-9)
_NEAREST = 1.0 + 2.0**-7


@functools.cache
def rounds_to_nearest(dtype):
    """Whether this process's `tf.matmul` in `dtype` accumulates in float32 and rounds its result to the nearest
    `dtype` number (True for float32 itself). Measured once per dtype, eagerly, on the default device."""
    dtype = tf.dtypes.as_dtype(dtype)
    if dtype == tf.float32 or dtype == tf.float64:
        return True
    with tf.init_scope():  # eager even when first asked while a tf.function is traced
        row = tf.constant([_PROBE_ROW], dtype)
        got = float(tf.cast(tf.matmul(row, tf.ones([len(_PROBE_ROW), 1], dtype)), tf.float32)[0, 0])
    nearest = got == _NEAREST
    if not nearest:
        log.debug(
            "this device's %s matmul does not round its products to nearest (1 + 0.75 * 2^-7 came back as %r): "
            "%s matmuls run as float32 matmuls of rounded operands, their products rounded",
            dtype.name,
            got,
            dtype.name,
        )
    return nearest


@functools.cache
def conv_rounds_to_nearest(dtype):
    """`rounds_to_nearest` for `tf.nn.conv1d` (a different kernel: on x86 with AVX2 only, oneDNN runs TensorFlow's
    bfloat16 convolution and rounds to nearest while Eigen's bfloat16 matmul truncates). Measured once per dtype."""
    dtype = tf.dtypes.as_dtype(dtype)
    if dtype == tf.float32 or dtype == tf.float64:
        return True
    with tf.init_scope():
        x = tf.constant([_PROBE_ROW], dtype)[:, :, None]  # (1, 4 positions, 1 channel)
        kernel = tf.ones([len(_PROBE_ROW), 1, 1], dtype)
        got = float(tf.cast(tf.nn.conv1d(x, kernel, stride=1, padding="VALID"), tf.float32)[0, 0, 0])
    nearest = got == _NEAREST
    if not nearest:
        log.debug("this device's %s convolution does not round to nearest (got %r): run in float32", dtype.name, got)
    return nearest


def round_to(t, dtype):
    """`t` rounded to the nearest `dtype` number, kept in `t`'s dtype."""
    return tf.cast(tf.cast(t, dtype), t.dtype)


def low_precision_matmul(a, b, dtype=None, transpose_a=False, transpose_b=False):
    """`a @ b` with the operands, the product and (under a GradientTape) the gradients' operands and products
    rounded to `dtype`, accumulated in float32; returned in `a`'s dtype.

    Args:
        a, b: float tensors of one dtype, rank 2 (or batched as `tf.matmul` takes them).
        dtype: the matmul dtype, e.g. "bfloat16"; None or `a`'s own dtype: a plain `tf.matmul`.
        transpose_a, transpose_b: as `tf.matmul`'s.
    Returns:
        `a`'s dtype, shape as `tf.matmul`'s.
    """
    a, b = tf.convert_to_tensor(a), tf.convert_to_tensor(b)
    dtype = a.dtype if dtype is None else tf.dtypes.as_dtype(dtype)
    if dtype == a.dtype:
        return tf.matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b)
    if rounds_to_nearest(dtype):
        product = tf.matmul(tf.cast(a, dtype), tf.cast(b, dtype), transpose_a=transpose_a, transpose_b=transpose_b)
        return tf.cast(product, a.dtype)
    return _emulated_matmul(a, b, dtype, transpose_a, transpose_b)


def _emulated_matmul(a, b, dtype, transpose_a, transpose_b):
    """What a round-to-nearest `dtype` matmul computes, in `a`'s dtype; its gradient as TF's matmul gradient of the
    cast operands (upstream rounded, each product rounded)."""

    def mm(x, y, ta=False, tb=False):
        return round_to(tf.matmul(x, y, transpose_a=ta, transpose_b=tb), dtype)

    @tf.custom_gradient
    def run(a, b):
        ra, rb = round_to(a, dtype), round_to(b, dtype)

        def grad(upstream):
            g = round_to(upstream, dtype)
            if not transpose_a and not transpose_b:  # C = A B
                return mm(g, rb, tb=True), mm(ra, g, ta=True)
            if not transpose_a:  # C = A B^T
                return mm(g, rb), mm(g, ra, ta=True)
            if not transpose_b:  # C = A^T B
                return mm(rb, g, tb=True), mm(ra, g)
            return mm(rb, g, ta=True, tb=True), mm(g, ra, ta=True, tb=True)  # C = A^T B^T

        return mm(ra, rb, transpose_a, transpose_b), grad

    return run(a, b)
