"""The biLM training model: CharCNN + BiLM + one softmax shared by both directions."""

import keras
import tensorflow as tf

from elmo_tf.config import BiLMConfig
from elmo_tf.layers.matmul_precision import low_precision_matmul
from elmo_tf.layers.tokens_to_char_ids import char_mapping
from elmo_tf.models.elmo import build_bilm_layers
from elmo_tf.models.lm_states import lm_states  # noqa: F401 (long imported from here too)


def sampled_softmax_loss(
    weights, biases, labels, inputs, num_sampled, num_classes, sampled_values=None, matmul_dtype=None
):
    """Sampled softmax cross-entropy per target, `logsumexp(t, s_1 .. s_K) - t`, with log-uniform negatives and
    accidental hits removed: the values and gradients of `tf.nn.sampled_softmax_loss(...,
    remove_accidental_hits=True)` to float rounding, with fewer passes over the `(targets, K)` logits.

    `t = x . w_y + b_y - log Q(y)` for the target `y`, `s_k = x . w_k + b_k - log Q(k)` for the K sampled classes
    (minus float32's largest value where `k == y`). tf.nn's version concatenates `[t, s]` and a dense label matrix
    of the same size, adds the accidental hits through a dense `SparseToDense`, and runs the fused softmax
    cross-entropy over the concatenation (at the original shapes, 2 x 1,280 targets x 8,192 negatives, each such
    array is 84 MB); here the hits are scattered into the logits in place, and the loss and its gradient
    (`d s_k = g exp(s_k - lse)`, `d t = g (exp(t - lse) - 1)`) are computed from one array of exponentials.

    Args:
        weights: float `(num_classes, dim)`; biases: float `(num_classes,)`.
        labels: int64 `(targets, 1)`; inputs: float `(targets, dim)`.
        num_sampled: K; num_classes: the sampler's range.
        sampled_values: optional `(sampled, true_expected_count, sampled_expected_count)` as
            `tf.random.log_uniform_candidate_sampler` returns them; default: one draw of it (`unique=True`).
        matmul_dtype: optional dtype of the `(targets, K)` logits' matmul and its gradients (e.g. "bfloat16");
            the logits come back in the inputs' dtype, rounded to nearest on every CPU (`low_precision_matmul`).
    Returns:
        float `(targets,)`.
    """
    if sampled_values is None:
        sampled_values = tf.random.log_uniform_candidate_sampler(
            true_classes=labels, num_true=1, num_sampled=num_sampled, unique=True, range_max=num_classes
        )
    sampled, true_expected, sampled_expected = (tf.stop_gradient(v) for v in sampled_values)
    sampled, flat_labels = tf.cast(sampled, tf.int64), tf.reshape(labels, [-1])
    true_logits = (
        tf.reduce_sum(inputs * tf.gather(weights, flat_labels), axis=1)
        + tf.gather(biases, flat_labels)
        - tf.math.log(tf.reshape(true_expected, [-1]))
    )
    sampled_bias = tf.gather(biases, sampled) - tf.math.log(sampled_expected)
    products = low_precision_matmul(inputs, tf.gather(weights, sampled), matmul_dtype, transpose_b=True)
    sampled_logits = products + sampled_bias
    rows, columns, hit_weights = tf.nn.compute_accidental_hits(labels, sampled, num_true=1)
    hits = tf.stack([rows, tf.cast(columns, tf.int32)], axis=1)
    sampled_logits = tf.tensor_scatter_nd_add(sampled_logits, hits, tf.cast(hit_weights, sampled_logits.dtype))
    return _log_softmax_loss(true_logits, sampled_logits)


@tf.custom_gradient
def _log_softmax_loss(true_logits, sampled_logits):
    """`logsumexp([t, s_1 .. s_K]) - t` per row, and its gradient from the same exponentials."""
    top = tf.maximum(true_logits, tf.reduce_max(sampled_logits, axis=1))
    exp_sampled = tf.exp(sampled_logits - top[:, None])
    exp_true = tf.exp(true_logits - top)
    total = exp_true + tf.reduce_sum(exp_sampled, axis=1)
    loss = tf.math.log(total) + top - true_logits

    def grad(upstream):
        scale = upstream / total
        return upstream * (exp_true / total - 1.0), exp_sampled * scale[:, None]

    return loss, grad


@keras.saving.register_keras_serializable(package="elmo_tf")
class BiLMPretrainer(keras.Model):
    """Forward LM predicts each next token, backward LM each previous one, from the top biLM layer.

    Sublayers `char_cnn` and `bilm` have the same names and weights as in `ELMo`, so the bilm-tf
    weight writer (`elmo_tf.io.save_bilm_weights`) and `ELMo` accept this model's biLM as is.

    Sentences get `<S>` / `</S>` around them (as at inference); at position t the forward LM predicts
    token t+1 and the backward LM token t-1, so `</S>` and `<S>` are predicted too.

    Args:
        config: `BiLMConfig` or options dict.
        vocab_size: softmax size (vocabulary ids sorted by frequency for the log-uniform sampler).
        bos_id: vocabulary id of `<S>`.
        eos_id: vocabulary id of `</S>`.
        num_sampled: negatives of the sampled softmax in training.
        dropout: biLM input dropout and dropout on the top layer before the softmax, in training.
        implementation: the `BiLM`'s loop ("auto": the LSTMs' hand-written backward pass in training; "scan": TF's
            automatic gradient, the reference the tests compare with; see `BiLM`).
        matmul_dtype: None (float32) or "bfloat16" (`TrainConfig.matmul_precision`): the dtype of the training step's
            LSTM and sampled-softmax matmuls; evaluation and inference run float32.
    Call arguments:
        inputs: dict with `char_ids` int32 `(batch, tokens, width)` (no boundaries, left-aligned; mapped by
            `char_mapping`, the config's own: `lm_dataset(..., char_mapping=model.char_mapping)`) and
            `token_ids` int32 `(batch, tokens)` (vocabulary ids of the same tokens).
    Returns:
        dict: `forward` and `backward` float `(batch, tokens + 2, P)` top-layer states,
        `targets_forward` / `targets_backward` int32 `(batch, tokens + 2)`, `weights` float
        `(batch, tokens + 2)` (1 where a target exists; the same positions for both directions after
        alignment, see `losses`).
    """

    def __init__(
        self,
        config=None,
        vocab_size=None,
        bos_id=0,
        eos_id=1,
        num_sampled=8192,
        dropout=0.1,
        implementation="auto",
        matmul_dtype=None,
        **kwargs,
    ):
        kwargs.setdefault("name", "bilm_pretrainer")
        super().__init__(**kwargs)
        if config is None:
            config = BiLMConfig()
        elif isinstance(config, dict):
            config = BiLMConfig.from_options(config)
        if not isinstance(vocab_size, int) or vocab_size < 4:
            raise ValueError(f"vocab_size must be an int >= 4, got {vocab_size!r}")
        if not isinstance(num_sampled, int) or num_sampled < 1:
            raise ValueError(f"num_sampled must be a positive int, got {num_sampled!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        self.config = config
        self.vocab_size = vocab_size
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.num_sampled = min(num_sampled, vocab_size - 1)
        self.dropout = float(dropout)
        self.char_cnn, self.bilm = build_bilm_layers(config, dropout, implementation, matmul_dtype)
        self.char_mapping = char_mapping(config)  # strings -> this model's char ids, as `ELMo.char_mapping`
        p = config.projection_dim
        self.softmax_kernel = self.add_weight(
            name="softmax_kernel",
            shape=(vocab_size, p),
            initializer=keras.initializers.RandomNormal(stddev=1.0 / p**0.5),
        )
        self.softmax_bias = self.add_weight(name="softmax_bias", shape=(vocab_size,), initializer="zeros")
        self.built = True

    def call(self, inputs, training=None):
        return lm_states(
            self.char_cnn, self.bilm, inputs, self.bos_id, self.eos_id, training, self.dropout, self.char_mapping
        )

    @property
    def implementation(self):
        """The biLM's loop (a constructor argument, read-only: the `BiLM` holds it)."""
        return self.bilm.implementation

    @property
    def matmul_dtype(self):
        """The training step's matmul dtype (a constructor argument, read-only: the `BiLM` holds it)."""
        return self.bilm.matmul_dtype

    def _flatten(self, out, direction):
        keep = out["weights"] > 0
        return tf.boolean_mask(out[direction], keep), tf.boolean_mask(out[f"targets_{direction}"], keep)

    def losses_sum(self, inputs, training=False, sampled=None):
        """Summed cross-entropies: `(forward_sum, backward_sum, n_targets)`.

        `sampled` (default: `training`) uses the sampled softmax, with one draw of log-uniform negatives for
        both directions; otherwise the full softmax (exact, for perplexity), one direction at a time (its logits
        are `(targets, vocab_size)` floats).
        """
        sampled = training if sampled is None else sampled
        out = self(inputs, training=training)
        (states_f, targets_f), (states_b, targets_b) = self._flatten(out, "forward"), self._flatten(out, "backward")
        count = tf.reduce_sum(out["weights"])
        if sampled:
            # one sampled softmax for both directions: one draw of negatives, one gather of their rows, one matmul.
            # The sampler already shares its negatives over every target of a batch; now over both directions too.
            loss = sampled_softmax_loss(
                weights=self.softmax_kernel.value,
                biases=self.softmax_bias.value,
                labels=tf.cast(tf.concat([targets_f, targets_b], axis=0)[:, None], tf.int64),
                inputs=tf.concat([states_f, states_b], axis=0),
                num_sampled=self.num_sampled,
                num_classes=self.vocab_size,
                matmul_dtype=self.matmul_dtype,
            )
            n_forward = tf.shape(targets_f)[0]
            return tf.reduce_sum(loss[:n_forward]), tf.reduce_sum(loss[n_forward:]), count
        sums = []
        for states, targets in ((states_f, targets_f), (states_b, targets_b)):
            logits = tf.matmul(states, self.softmax_kernel, transpose_b=True) + self.softmax_bias
            sums.append(tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=logits)))
        return sums[0], sums[1], count

    def get_config(self):
        config = super().get_config()
        config.update(
            config=self.config.to_options(),
            vocab_size=self.vocab_size,
            bos_id=self.bos_id,
            eos_id=self.eos_id,
            num_sampled=self.num_sampled,
            dropout=self.dropout,
            implementation=self.implementation,
            matmul_dtype=self.matmul_dtype,
        )
        return config

    @classmethod
    def from_config(cls, config):
        return cls(**config)
