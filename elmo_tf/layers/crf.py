"""Linear-chain CRF: negative log-likelihood training and Viterbi decoding, with transition constraints.

Written by hand: no maintained Keras 3 CRF exists (tensorflow-addons, which had one, is end-of-life).
"""

import keras
import numpy as np
import tensorflow as tf

NEG_INF = -1e4  # score of a forbidden transition: exp() underflows to 0, no NaN from inf - inf


def _if_more_than_one_step(potentials, scan, no_scan):
    """`scan()` when `potentials` (batch, time, K) has more than one time step, else `no_scan()`.

    In a graph a scan over no steps fails: with a known time dimension (a shape fixed by a signature or by Keras's
    data adapter) `[-1]` of an empty scan fails at tracing, and with an unknown one stacking no steps fails when run.
    So the branch is taken in Python when the time dimension is known, and by `tf.cond` when it is not.
    """
    steps = potentials.shape[1]
    if steps is not None:
        return scan() if steps > 1 else no_scan()
    return tf.cond(tf.shape(potentials)[1] > 1, scan, no_scan)


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
            if allowed is None:
                return tf.convert_to_tensor(weight)
            return tf.where(tf.constant(allowed), tf.convert_to_tensor(weight), NEG_INF)

        return (
            apply(self.transitions, self.allowed_transitions),
            apply(self.start_transitions, self.allowed_start),
            apply(self.end_transitions, self.allowed_end),
        )

    @staticmethod
    def _prepare(potentials, mask, tags=None):
        """Checks shapes; a batch with no time steps gets one masked step (scores 0, no tags)."""
        potentials = tf.convert_to_tensor(potentials)
        if potentials.shape.rank != 3:
            raise ValueError(f"CRF potentials must have shape (batch, time, num_tags), got {potentials.shape}")
        if mask is None:
            mask = tf.ones(tf.shape(potentials)[:2], tf.bool)
        mask = tf.cast(mask, tf.bool)
        extra = tf.maximum(1 - tf.shape(potentials)[1], 0)
        potentials = tf.pad(potentials, [[0, 0], [0, extra], [0, 0]])
        mask = tf.pad(mask, [[0, 0], [0, extra]])
        if tags is not None:
            tags = tf.pad(tf.cast(tags, tf.int32), [[0, 0], [0, extra]])
        return potentials, mask, tags

    def log_likelihood(self, potentials, tags, mask=None):
        """`log p(tags | potentials)` per sentence, float `(batch,)` (0 for an empty sentence)."""
        potentials, mask, tags = self._prepare(potentials, mask, tags)
        trans, start, end = self._constrained()
        maskf = tf.cast(mask, potentials.dtype)
        lengths = tf.reduce_sum(tf.cast(mask, tf.int32), axis=1)
        # score of the given path
        emit = tf.reduce_sum(tf.gather(potentials, tags, batch_dims=2) * maskf, axis=1)
        pair = tf.gather_nd(trans, tf.stack([tags[:, :-1], tags[:, 1:]], axis=-1))
        moves = tf.reduce_sum(pair * maskf[:, 1:], axis=1)
        last = tf.gather(tags, tf.maximum(lengths - 1, 0), batch_dims=1)
        nonempty = tf.cast(lengths > 0, potentials.dtype)
        score = (emit + moves + tf.gather(start, tags[:, 0]) + tf.gather(end, last)) * nonempty
        # partition function: forward algorithm, state frozen past each sentence's end
        alpha0 = start + potentials[:, 0]
        steps_x = tf.transpose(potentials[:, 1:], [1, 0, 2])
        steps_m = tf.transpose(mask[:, 1:])

        def forward(alpha, inputs):
            x_t, m_t = inputs
            new = tf.reduce_logsumexp(alpha[:, :, None] + trans[None], axis=1) + x_t
            return tf.where(m_t[:, None], new, alpha)

        alpha = _if_more_than_one_step(
            potentials, lambda: tf.scan(forward, (steps_x, steps_m), initializer=alpha0)[-1], lambda: alpha0
        )
        log_z = tf.reduce_logsumexp(alpha + end, axis=1) * nonempty
        return score - log_z

    def decode(self, potentials, mask=None):
        """Viterbi: `(tags int32 (batch, time), best score (batch,))`; tags are 0 at padding."""
        steps_in = tf.shape(potentials)[1]
        potentials, mask, _ = self._prepare(potentials, mask)
        trans, start, end = self._constrained()
        batch = tf.shape(potentials)[0]
        lengths = tf.reduce_sum(tf.cast(mask, tf.int32), axis=1)
        delta0 = start + potentials[:, 0]
        steps_x = tf.transpose(potentials[:, 1:], [1, 0, 2])
        steps_m = tf.transpose(mask[:, 1:])
        identity = tf.broadcast_to(tf.range(self.num_tags)[None], [batch, self.num_tags])

        def forward(carry, inputs):
            delta, _ = carry
            x_t, m_t = inputs
            scores = delta[:, :, None] + trans[None]  # (batch, from, to)
            best_from = tf.argmax(scores, axis=1, output_type=tf.int32)
            new = tf.reduce_max(scores, axis=1) + x_t
            # past the end: keep delta, backpointer = identity (the path stays put)
            return tf.where(m_t[:, None], new, delta), tf.where(m_t[:, None], best_from, identity)

        def run():
            deltas, pointers = tf.scan(
                forward, (steps_x, steps_m), initializer=(delta0, tf.zeros([batch, self.num_tags], tf.int32))
            )
            return deltas[-1], pointers

        delta, pointers = _if_more_than_one_step(
            potentials, run, lambda: (delta0, tf.zeros([0, batch, self.num_tags], tf.int32))
        )
        final = delta + end
        best_last = tf.argmax(final, axis=1, output_type=tf.int32)
        best_score = tf.reduce_max(final, axis=1)

        def back(tag, pointer_t):
            previous = tf.gather(pointer_t, tag, batch_dims=1)
            previous.set_shape(tag.shape)
            return previous

        earlier = _if_more_than_one_step(  # tags at 0..T-2
            potentials,
            lambda: tf.scan(back, pointers, initializer=best_last, reverse=True),
            lambda: tf.zeros([0, batch], tf.int32),
        )
        path = tf.concat([tf.transpose(earlier), best_last[:, None]], axis=1)
        # identity pointers past each end carry the last real tag back to position length-1
        path = tf.where(mask, path, 0)[:, :steps_in]
        nonempty = lengths > 0
        return path, tf.where(nonempty, best_score, 0.0)

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
