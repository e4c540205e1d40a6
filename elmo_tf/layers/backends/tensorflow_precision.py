"""TensorFlow's side of `elmo_tf.layers.low_precision`: the bfloat16 copies of a layer's kernels, held in variables and
converted once, and the decision to emulate a bfloat16 op that does not round to nearest (`matmul_precision`).

`KernelCopies` converts the float32 weights when the layer is built, and again only after they changed: a Keras
`variable.assign` of one of them (Keras's loading and `set_weights`, `elmo_tf.io`'s loaders, tests' randomizing: each
source variable's assign is watched, in eager code and in traced functions alike), any gradient taken through a copy
(a copy's gradient goes to its float32 variable, as `tf.cast`'s would, and marks the copies stale: an optimizer step,
which writes the `tf.Variable` underneath, may follow), or `low_precision.weights_changed`. A `stale` flag, read at
each call under a `tf.cond`, says whether the copies must be converted first. So a traced function (the
Embedder's, a SavedModel's) reads bfloat16 variables, and the conversion runs once per change of the weights (in
training, once per step), never per call of an unchanged model and never per step of a loop.

The copies are plain `tf.Variable`s held by a plain object, not by the layer's Keras tracking: they are not Keras
weights (not in `layer.weights`, `.keras` files, weight files, fingerprints) nor in `tf.train.Checkpoint`s of the
layer; an export that calls the layer captures them (Keras's `ExportArchive` tracks the variables its endpoints use).
"""

import tensorflow as tf

from elmo_tf.layers.matmul_precision import conv_rounds_to_nearest, round_to, rounds_to_nearest

LOW = tf.bfloat16


def emulated(op):
    """`low_precision.emulated` on TensorFlow: the probes of `matmul_precision`, once per process."""
    probe = rounds_to_nearest if op == "matmul" else conv_rounds_to_nearest
    return not probe(LOW)


def conv1d(x, kernel):
    return tf.nn.conv1d(x, kernel, stride=1, padding="VALID")


def matmul(a, b, transpose_b=False):
    """`tf.matmul(a, b, transpose_b=...)` of float32 `a` and a kernel `b`: float32 `b`, the plain matmul; bfloat16 `b`
    (a layer's copy), `a` cast to bfloat16 and the product back to float32, or where this device's bfloat16 matmul
    does not round to nearest, the same numbers in float32 (`b` widened, `a` and the product rounded)."""
    if b.dtype != LOW:
        return tf.matmul(a, b, transpose_b=transpose_b)
    if emulated("matmul"):
        product = tf.matmul(round_to(a, LOW), tf.cast(b, a.dtype), transpose_b=transpose_b)
        return round_to(product, LOW)
    return tf.cast(tf.matmul(tf.cast(a, LOW), b, transpose_b=transpose_b), a.dtype)


class KernelCopies:
    """bfloat16 copies of float32 variables (`low_precision.kernel_copies`).

    Args:
        variables: the layer's float32 (Keras) variables, in the order `read` returns their copies.
        name: a prefix for the copies' names.
    Attributes:
        copies: the bfloat16 `tf.Variable`s.
        stale: bool `tf.Variable`: the copies must be converted before they are read.
        conversions: int64 `tf.Variable`: how many times the copies were converted (tests count them).
    """

    def __init__(self, variables, name):
        self.sources = list(variables)
        with tf.init_scope():  # eager, even when the layer is built while a function is traced
            self.copies = [
                tf.Variable(tf.zeros(v.shape, LOW), trainable=False, name=f"{name}_bfloat16_{k}")
                for k, v in enumerate(self.sources)
            ]
            self.stale = tf.Variable(True, trainable=False, name=f"{name}_bfloat16_stale")
            self.conversions = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{name}_bfloat16_conversions")
            self.refresh()
        for source in self.sources:
            self._watch(source)

    def _watch(self, variable):
        """Marks the copies stale whenever `variable` (a Keras variable) is assigned: its `_direct_assign`, where
        every Keras `assign`, `assign_add` and `assign_sub` ends (keras/src/backend/common/variables.py), is wrapped.
        A variable without it (another Keras) is not watched: then only the other signals mark the copies."""
        assign = getattr(variable, "_direct_assign", None)
        if assign is None:
            return
        stale = self.stale

        def direct_assign(value):
            assign(value)
            stale.assign(True)

        variable._direct_assign = direct_assign

    def _convert(self):
        for source, copy in zip(self.sources, self.copies):
            copy.assign(tf.cast(tf.convert_to_tensor(source), LOW))
        self.stale.assign(False)
        self.conversions.assign_add(1)
        return tf.constant(True)

    def refresh(self):
        """Converts the copies now if they are stale (eagerly: under `tf.init_scope`). Keeps them stale where a
        weight cannot be read yet (Keras's deferred initialization): the next read converts them."""
        with tf.init_scope():
            if not bool(self.stale.numpy()):
                return
            try:
                values = [tf.convert_to_tensor(source) for source in self.sources]
            except (ValueError, TypeError, AttributeError):
                return
            for value, copy in zip(values, self.copies):
                copy.assign(tf.cast(value, LOW))
            self.stale.assign(False)
            self.conversions.assign_add(1)

    def changed(self):
        """The weights changed: convert the copies at the next read."""
        self.stale.assign(True)

    def read(self):
        """The copies, converted first if stale; their gradients go to the float32 variables."""
        tf.cond(self.stale, self._convert, lambda: tf.constant(False))
        return [
            self._through(tf.convert_to_tensor(source), copy.read_value())
            for source, copy in zip(self.sources, self.copies)
        ]

    def _through(self, source, copy):
        """`copy` (the bfloat16 copy of `source`), whose gradient goes to `source` as `tf.cast(source, bfloat16)`'s
        would, and marks the copies stale."""
        stale = self.stale

        @tf.custom_gradient
        def read(source, copy):
            def grad(upstream):
                stale.assign(True)
                return tf.cast(upstream, source.dtype), None

            return tf.identity(copy), grad

        return read(source, copy)
