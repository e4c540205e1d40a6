"""Linear-chain CRF: negative log-likelihood training and Viterbi decoding, with transition constraints.

Written by hand: no maintained Keras 3 CRF exists (tensorflow-addons, which had one, is end-of-life).
"""

import keras
import numpy as np
from keras import ops

from elmo_tf.layers import backends
from elmo_tf.layers.ops_recurrence import scan_carries

NEG_INF = -1e4  # score of a forbidden transition: exp() underflows to 0, no NaN from inf - inf


def _if_more_than_one_step(potentials, scan, no_scan):
    """`scan()` when `potentials` (batch, time, K) has more than one time step, else `no_scan()`.

    A scan over no steps is avoided on every backend: in a TensorFlow graph stacking no steps fails when run, and
    PyTorch's Keras scan stacks a list (none to stack). So the branch is taken in Python when the time dimension is
    known (always on JAX and PyTorch), and when the graph runs where it is not (a TensorFlow graph without a fixed
    shape: `backends.cond_more_than_one_step`).
    """
    steps = potentials.shape[1]
    if steps is not None:
        return scan() if steps > 1 else no_scan()
    return backends.cond_more_than_one_step(potentials, scan, no_scan)


def _argmax(x, axis):
    """int32 argmax; TensorFlow's own where Keras's argmax fails on an empty batch (its tie handling takes a max of the
    empty tensor)."""
    try:
        return backends.argmax(x, axis)
    except NotImplementedError:
        return ops.cast(ops.argmax(x, axis=axis), "int32")


def _max(x, axis):
    """`ops.max`; TensorFlow's own where Keras's max asserts that the tensor is not empty (a batch of no sentences
    is)."""
    try:
        return backends.reduce_max(x, axis)
    except NotImplementedError:
        return ops.max(x, axis=axis)


@keras.saving.register_keras_serializable(package="elmo_tf")
class CRF(keras.layers.Layer):
    """Score of tags `y` for potentials `x`: `start[y_1] + sum_t x_t[y_t] + sum_t T[y_{t-1}, y_t] + end[y_n]`.

    `log p(y | x) = score(y) - logsumexp_y' score(y')` (forward algorithm); decoding is Viterbi.
    Forbidden transitions (e.g. O -> I-PER in IOB2) get a fixed score of -1e4 and are never decoded.

    Args:
        num_tags: number of tags K.
        allowed_transitions: optional bool `(K, K)` (nested lists), `[i][j]` True when tag i may be
            followed by tag j; None allows all.
        allowed_start: optional bool `(K,)`: which tags may start a sentence.
        allowed_end: optional bool `(K,)`: which tags may end a sentence.
    Call arguments:
        inputs: float potentials `(batch, time, K)`.
        mask: bool `(batch, time)`, True for real tokens (left-aligned); None for all real.
    Returns:
        int32 `(batch, time)` Viterbi tags (0 at padding).
    """

    def __init__(self, num_tags, allowed_transitions=None, allowed_start=None, allowed_end=None, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(num_tags, int) or num_tags < 1:
            raise ValueError(f"num_tags must be a positive int, got {num_tags!r}")
        self.num_tags = num_tags

        def check(value, shape, name):
            if value is None:
                return None
            array = np.asarray(value, dtype=bool)
            if array.shape != shape:
                raise ValueError(f"{name} must have shape {shape}, got {array.shape}")
            return array.tolist()

        self.allowed_transitions = check(allowed_transitions, (num_tags, num_tags), "allowed_transitions")
        self.allowed_start = check(allowed_start, (num_tags,), "allowed_start")
        self.allowed_end = check(allowed_end, (num_tags,), "allowed_end")
        self.supports_masking = True

    def build(self, input_shape):
        k = self.num_tags
        self.transitions = self.add_weight(name="transitions", shape=(k, k), initializer="glorot_uniform")
        self.start_transitions = self.add_weight(name="start_transitions", shape=(k,), initializer="zeros")
        self.end_transitions = self.add_weight(name="end_transitions", shape=(k,), initializer="zeros")

    def _constrained(self):
        """(transitions, start, end) with forbidden entries set to NEG_INF."""

        def apply(weight, allowed):
            weight = ops.convert_to_tensor(weight)
            return weight if allowed is None else ops.where(np.asarray(allowed), weight, NEG_INF)

        return (
            apply(self.transitions, self.allowed_transitions),
            apply(self.start_transitions, self.allowed_start),
            apply(self.end_transitions, self.allowed_end),
        )

    @staticmethod
    def _prepare(potentials, mask, tags=None):
        """Checks shapes; a batch with no time steps gets one masked step (scores 0, no tags)."""
        potentials = ops.convert_to_tensor(potentials)
        if len(potentials.shape) != 3:
            raise ValueError(f"CRF potentials must have shape (batch, time, num_tags), got {tuple(potentials.shape)}")
        if mask is None:
            mask = ops.ones(ops.shape(potentials)[:2], "bool")
        mask = ops.cast(mask, "bool")
        steps = potentials.shape[1]  # known on JAX and PyTorch, maybe not in a TensorFlow graph
        extra = max(1 - steps, 0) if steps is not None else ops.maximum(1 - ops.shape(potentials)[1], 0)
        potentials = ops.pad(potentials, [[0, 0], [0, extra], [0, 0]])
        mask = ops.pad(mask, [[0, 0], [0, extra]])
        if tags is not None:
            tags = ops.pad(ops.cast(tags, "int32"), [[0, 0], [0, extra]])
        return potentials, mask, tags

    def log_likelihood(self, potentials, tags, mask=None):
        """`log p(tags | potentials)` per sentence, float `(batch,)` (0 for an empty sentence)."""
        potentials, mask, tags = self._prepare(potentials, mask, tags)
        trans, start, end = self._constrained()
        k = self.num_tags
        maskf = ops.cast(mask, potentials.dtype)
        lengths = ops.sum(ops.cast(mask, "int32"), axis=1)
        # score of the given path
        emit = ops.sum(ops.take_along_axis(potentials, tags[:, :, None], axis=2)[:, :, 0] * maskf, axis=1)
        pair = ops.take(ops.reshape(trans, (-1,)), tags[:, :-1] * k + tags[:, 1:])
        moves = ops.sum(pair * maskf[:, 1:], axis=1)
        last = ops.take_along_axis(tags, ops.maximum(lengths - 1, 0)[:, None], axis=1)[:, 0]
        nonempty = ops.cast(lengths > 0, potentials.dtype)
        score = (emit + moves + ops.take(start, tags[:, 0]) + ops.take(end, last)) * nonempty
        # partition function: forward algorithm, state frozen past each sentence's end
        alpha0 = start + potentials[:, 0]
        steps_x = ops.transpose(potentials[:, 1:], (1, 0, 2))
        steps_m = ops.transpose(mask[:, 1:])

        def forward(alpha, inputs):
            x_t, m_t = inputs
            new = ops.logsumexp(alpha[:, :, None] + trans[None], axis=1) + x_t
            alpha = ops.where(m_t[:, None], new, alpha)
            return alpha, alpha

        alpha = _if_more_than_one_step(
            potentials, lambda: scan_carries(forward, alpha0, (steps_x, steps_m))[0], lambda: alpha0
        )
        log_z = ops.logsumexp(alpha + end, axis=1) * nonempty
        return score - log_z

    def decode(self, potentials, mask=None):
        """Viterbi: `(tags int32 (batch, time), best score (batch,))`; tags are 0 at padding."""
        steps_in = ops.shape(potentials)[1]
        potentials, mask, _ = self._prepare(potentials, mask)
        trans, start, end = self._constrained()
        batch = ops.shape(potentials)[0]
        lengths = ops.sum(ops.cast(mask, "int32"), axis=1)
        delta0 = start + potentials[:, 0]
        steps_x = ops.transpose(potentials[:, 1:], (1, 0, 2))
        steps_m = ops.transpose(mask[:, 1:])
        identity = ops.broadcast_to(ops.arange(self.num_tags, dtype="int32")[None], (batch, self.num_tags))

        def forward(carry, inputs):
            delta, _ = carry
            x_t, m_t = inputs
            scores = delta[:, :, None] + trans[None]  # (batch, from, to)
            best_from = _argmax(scores, axis=1)
            new = _max(scores, axis=1) + x_t
            # past the end: keep delta, backpointer = identity (the path stays put)
            out = ops.where(m_t[:, None], new, delta), ops.where(m_t[:, None], best_from, identity)
            return out, out

        def run():
            (delta, _), (_, pointers) = scan_carries(forward, (delta0, identity), (steps_x, steps_m))
            return delta, pointers

        delta, pointers = _if_more_than_one_step(
            potentials, run, lambda: (delta0, ops.zeros((0, batch, self.num_tags), "int32"))
        )
        final = delta + end
        best_last = _argmax(final, axis=1)
        best_score = _max(final, axis=1)

        def back(tag, pointer_t):
            previous = ops.take_along_axis(pointer_t, tag[:, None], axis=1)[:, 0]
            return previous, previous

        earlier = _if_more_than_one_step(  # tags at 0..T-2
            potentials,
            lambda: scan_carries(back, best_last, pointers, reverse=True)[1],
            lambda: ops.zeros((0, batch), "int32"),
        )
        path = ops.concatenate([ops.transpose(earlier), best_last[:, None]], axis=1)
        # identity pointers past each end carry the last real tag back to position length-1
        path = ops.where(mask, path, 0)[:, :steps_in]
        return path, ops.where(lengths > 0, best_score, 0.0)

    def call(self, inputs, mask=None):
        return self.decode(inputs, mask)[0]

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1])

    def compute_output_spec(self, inputs, mask=None):
        return keras.KerasTensor(tuple(inputs.shape[:-1]), dtype="int32")

    def compute_mask(self, inputs, mask=None):
        return mask

    def get_config(self):
        config = super().get_config()
        config.update(
            num_tags=self.num_tags,
            allowed_transitions=self.allowed_transitions,
            allowed_start=self.allowed_start,
            allowed_end=self.allowed_end,
        )
        return config
