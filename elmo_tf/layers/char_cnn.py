"""The ELMo token encoder: characters -> context-free token vectors."""

import keras
import numpy as np
from keras import ops

from elmo_tf.layers import backends, low_precision
from elmo_tf.layers.highway import Highway
from elmo_tf.preprocessing.chars import MAX_CHARS, NUM_CHAR_IDS, PAD

# `encode_tokens` cuts the char positions to a width rounded up to a multiple of this (the extra positions are padding
# windows, whose value the max takes anyway): oneDNN's convolutions (TensorFlow's, PyTorch's) keep a primitive per
# input shape, and JAX compiles its ops per shape; the exact width (longest token + widest filter - 1: about 40
# values) multiplied the shapes a long run meets (on TensorFlow, 600 chunks of random words grew the RSS by 100 MiB
# before leveling off; 23 MiB at one width).
CUT_WIDTH_MULTIPLE = 4


def _padding_row_zero(initializer):
    """Row 0 of the char embedding is the padding row: zero, as in the weight files."""

    def init(shape, dtype=None):
        values = initializer(shape, dtype=dtype)
        return ops.concatenate([ops.zeros_like(values[:1]), values[1:]], axis=0)

    return init


ORIGINAL_FILTERS = ((1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024))


def _check_arguments(filters, max_chars, pad_id, word_vocab_size, word_embedding_dim, **sizes):
    """Validates `CharCNN`'s arguments (`sizes`: the positive ints among them); returns `filters` as int pairs."""
    filters = tuple((int(w), int(n)) for w, n in filters)
    if not filters:
        raise ValueError(f"filters must be a non-empty list of (width, num_filters), got {filters!r}")
    for width, n in filters:
        if width < 1 or n < 1 or width > max_chars:
            raise ValueError(
                f"filters entries need 1 <= width <= max_chars ({max_chars}) and num_filters >= 1, got ({width}, {n})"
            )
    for name, value in (*sizes.items(), ("max_chars", max_chars)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if not isinstance(pad_id, int) or not 0 < pad_id < sizes["num_chars"]:
        raise ValueError(f"pad_id must be an int in [1, num_chars), got {pad_id!r}")
    for name, value in (("word_vocab_size", word_vocab_size), ("word_embedding_dim", word_embedding_dim)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    if (word_vocab_size > 0) != (word_embedding_dim > 0):
        raise ValueError(
            f"word_vocab_size and word_embedding_dim are both 0 or both positive, got {word_vocab_size}, "
            f"{word_embedding_dim}"
        )
    return filters


@keras.saving.register_keras_serializable(package="elmo_tf")
class CharCNN(keras.layers.Layer):
    """Char embedding -> convolutions over chars -> max over positions -> activation -> highway -> projection.

    For each `(width, n)` in `filters`: a VALID convolution over the char axis, the max over all positions (padding
    chars included, as in the original), then `activation`; filters are concatenated, passed through `num_highway`
    highway layers and projected to `projection_dim` (`x W + b`, only when the filter total differs from
    `projection_dim`, as bilm-tf does). Only real tokens (a row with any non-zero id) are encoded; padding rows give
    zero vectors.

    Args:
        filters: sequence of `(width, num_filters)`.
        num_highway: number of highway layers.
        projection_dim: output size.
        char_embedding_dim: size of each char vector.
        num_chars: rows of the char embedding (262: row 0 is the padding row, kept at zero by the data).
        max_chars: chars per token (50).
        activation: after the max-pool ("relu" or "tanh"); the highway transform is always relu, as in the original.
        pad_id: the (shifted) id that fills a token after its end-of-word (bilm-tf's 261; a converted ELMoForManyLangs
            model's `<pad>` + 1, a trained non-zero row: the max-pool runs over every position).
        word_vocab_size: rows (row 0 zero, "no token") of a word embedding whose ids come in one more input
            column after the chars; its vector goes before the filters: `projection([word; highway(char CNN)])`
            (ELMoForManyLangs). 0 for none.
        word_embedding_dim: that word embedding's size (0 for none).
        always_project: project even when the token size equals `projection_dim` (ELMoForManyLangs).
        precision: "float32" (default: the original numbers), "bfloat16" or "auto" (`elmo_tf.precision`): with
            bfloat16 the convolutions, the highway layers' and the projection's matmuls take bfloat16 operands (the
            weights' bfloat16 copies, `low_precision`) with float32 accumulation; biases, max-pool, activations and
            the output stay float32. The attribute `precision` is the computed one.
    Call arguments:
        inputs: int32 char ids `(batch, tokens, input_width)` (`max_chars`, + 1 with a word embedding), all-zero rows
            for padding.
    Returns:
        float32 `(batch, tokens, projection_dim)`, with a mask `(batch, tokens)`.
    """

    def __init__(
        self,
        filters=ORIGINAL_FILTERS,
        num_highway=2,
        projection_dim=512,
        char_embedding_dim=16,
        num_chars=NUM_CHAR_IDS,
        max_chars=MAX_CHARS,
        activation="relu",
        pad_id=PAD,
        word_vocab_size=0,
        word_embedding_dim=0,
        always_project=False,
        precision="float32",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.requested_precision, self.precision = low_precision.layer_precision(precision)
        sizes = dict(projection_dim=projection_dim, char_embedding_dim=char_embedding_dim, num_chars=num_chars)
        filters = _check_arguments(filters, max_chars, pad_id, word_vocab_size, word_embedding_dim, **sizes)
        self.filters = filters
        self.num_highway = num_highway
        self.projection_dim = projection_dim
        self.char_embedding_dim = char_embedding_dim
        self.num_chars = num_chars
        self.max_chars = max_chars
        self.activation = keras.activations.get(activation)
        self.pad_id = pad_id
        self.word_vocab_size = word_vocab_size
        self.word_embedding_dim = word_embedding_dim
        self.always_project = bool(always_project)
        self.num_filters = sum(n for _, n in filters)
        self.token_dim = self.num_filters + word_embedding_dim  # what the projection reads
        self.use_projection = self.always_project or self.token_dim != projection_dim
        self.input_width = max_chars + (1 if word_vocab_size else 0)  # the word id column after the chars

    def build(self, input_shape):
        self.char_embedding = self.add_weight(
            name="char_embedding",
            shape=(self.num_chars, self.char_embedding_dim),
            initializer=_padding_row_zero(keras.initializers.RandomUniform(-1.0, 1.0)),
        )
        self.conv_kernels, self.conv_biases = [], []
        for k, (width, n) in enumerate(self.filters):
            self.conv_kernels.append(
                self.add_weight(
                    name=f"conv_kernel_{k}", shape=(width, self.char_embedding_dim, n), initializer="glorot_uniform"
                )
            )
            self.conv_biases.append(self.add_weight(name=f"conv_bias_{k}", shape=(n,), initializer="zeros"))
        # relu in bilm-tf and AllenNLP
        self.highway = Highway(self.num_highway, activation="relu", precision=self.precision, name="highway")
        self.highway.build((None, self.num_filters))
        if self.word_vocab_size:
            self.word_embedding = self.add_weight(
                name="word_embedding",
                shape=(self.word_vocab_size, self.word_embedding_dim),
                initializer=_padding_row_zero(keras.initializers.RandomUniform(-0.25, 0.25)),
            )
        if self.use_projection:
            self.projection = keras.layers.Dense(self.projection_dim, name="projection")
            self.projection.build((None, self.token_dim))
        projection = [self.projection.kernel] if self.use_projection else []
        low_precision.attach(self, [self.char_embedding, *self.conv_kernels, *projection])

    @property
    def uses_bfloat16(self):
        """Whether this layer computes in bfloat16 (`precision`)."""
        return self.precision == low_precision.LOW

    def operands(self):
        """`(char embedding, conv kernels, projection kernel or None)`: float32, or their bfloat16 copies."""
        if not self.uses_bfloat16:
            return self.char_embedding, self.conv_kernels, self.projection.kernel if self.use_projection else None
        copies = low_precision.read(self)
        count = len(self.conv_kernels)
        return copies[0], copies[1 : 1 + count], copies[1 + count] if self.use_projection else None

    def project(self, h, kernel):
        """Token vectors `h` (float32 `(n, token_dim)`) projected with `kernel` (`operands`); `h` if none."""
        if not self.use_projection:
            return h
        if not self.uses_bfloat16:
            return self.projection(h)
        return low_precision.matmul(h, kernel) + self.projection.bias

    @property
    def widest(self):
        """The widest filter's width."""
        return max(width for width, _ in self.filters)

    def token_lengths(self, char_ids):
        """Char positions each token uses, up to its last id that is not `pad_id` (0 for an all-zero row), from
        NumPy char ids `(n, input_width)`: the lengths `encode_tokens` cuts by, for callers that plan its calls."""
        chars = char_ids[:, : self.max_chars]
        used = (chars != self.pad_id) & (chars > 0).any(axis=1)[:, None]
        return np.where(used.any(axis=1), self.max_chars - np.argmax(used[:, ::-1], axis=1), 0)

    def window_span(self, longest):
        """Char positions the convolutions need over tokens of at most `longest` positions: `longest + widest - 1`, at
        most `max_chars` (TensorFlow's `encode_tokens` runs at this, rounded up to `CUT_WIDTH_MULTIPLE`)."""
        return min(int(longest) + self.widest - 1, self.max_chars)

    def cut_width(self, longest):
        """Char positions JAX's and PyTorch's `encode_tokens` keep over tokens of at most `longest` positions: the
        longest token plus the widest filter (every filter then has a window of padding only inside the cut, so the
        maxes over the cut are those over all positions), rounded up to a multiple of `CUT_WIDTH_MULTIPLE` (fewer
        shapes for oneDNN and JAX to compile), at most `max_chars`."""
        kept = -(-(int(longest) + self.widest) // CUT_WIDTH_MULTIPLE) * CUT_WIDTH_MULTIPLE
        return min(kept, self.max_chars)

    def _check_ids(self, char_ids, rank):
        """`char_ids` as an int32 tensor of `rank` dimensions, the last `input_width`; a clear error otherwise."""
        char_ids = ops.convert_to_tensor(char_ids)
        dtype = keras.backend.standardize_dtype(char_ids.dtype)
        if not keras.backend.is_int_dtype(dtype):
            raise TypeError(f"CharCNN inputs must be integer char ids, got dtype {dtype}")
        shape = tuple(char_ids.shape)
        if (rank is not None and len(shape) != rank) or shape[-1] not in (None, self.input_width):
            lead = "(batch, tokens, " if rank == 3 else "(..., "
            raise ValueError(f"CharCNN inputs must have shape {lead}{self.input_width}), got {shape}")
        return ops.cast(char_ids, "int32")

    def _encode_rows(self, char_ids):
        """Token vectors of every row of int32 `(n, input_width)`, at every position given (the `keras.ops` path:
        JAX's and PyTorch's fast paths call it on the distinct rows, cut to the longest token), zeros for all-zero
        rows: float32 `(n, projection_dim)`."""
        chars = char_ids[:, : self.max_chars]
        embedding, kernels, projection = self.operands()
        x = ops.take(embedding, chars, axis=0)  # (n, max_chars, dim)
        pooled = []
        for kernel, bias in zip(kernels, self.conv_biases):
            if self.uses_bfloat16:
                conv = low_precision.conv1d(x, kernel)
            else:
                conv = ops.conv(x, kernel, strides=1, padding="valid", data_format="channels_last")
            pooled.append(self.activation(ops.max(conv + bias, axis=1)))
        h = self.highway(ops.concatenate(pooled, axis=-1))
        if self.word_vocab_size:
            h = ops.concatenate([ops.take(self.word_embedding, char_ids[:, self.max_chars], axis=0), h], axis=-1)
        h = self.project(h, projection)
        return h * ops.cast(ops.any(chars > 0, axis=1), h.dtype)[:, None]

    def _encode_all(self, char_ids):
        """`_encode_rows` over checked int32 ids `(..., input_width)` -> `(..., projection_dim)`."""
        flat = self._encode_rows(ops.reshape(char_ids, (-1, self.input_width)))
        return ops.reshape(flat, tuple(ops.shape(char_ids)[:-1]) + (self.projection_dim,))

    def encode_tokens(self, char_ids):
        """Encodes a flat batch of tokens: int32 `(n, max_chars)` -> float32 `(n, projection_dim)`.

        The convolutions run over the batch's longest token only, not all `max_chars` positions: past it, every
        real token has nothing but padding chars, so each of its windows there has the value of an all-padding
        window. When every real token is short enough to have at least one such window for every width (length
        <= max_chars - widest filter), the ids are cut to the longest token plus `widest - 1` positions (rounded up
        to a multiple of `CUT_WIDTH_MULTIPLE`: more all-padding windows, the same maxes), one
        all-padding token is encoded beside them, and each real token's max also takes that token's value: the
        same max as over all positions, and the same gradients (a tie's gradient goes to one of the equal
        windows instead of being shared). Words are far shorter than 50 bytes, so this halves the convolutions'
        work in typical batches. All-zero rows (no token) are left as they are, and a real token with anything
        but padding chars after its end keeps the whole width. PyTorch, and JAX on concrete ids, cut the same way
        (`backends.torch_char_cnn`, `backends.jax_char_cnn`); inside `jax.jit` every position is convolved (shapes
        that do not depend on the ids).
        """
        try:
            return backends.encode_tokens(self, char_ids)
        except NotImplementedError:
            return self._encode_rows(self._check_ids(char_ids, 2))

    def encode_distinct(self, char_ids):
        """The token vectors of `call`, computing each distinct token once: int char ids `(..., max_chars)` ->
        float32 `(..., projection_dim)`, zeros for all-zero rows (no token). What `ELMo`, its SavedModel, the
        embedder and pretraining encode tokens with.

        Tokens repeat within a batch (`<S>` and `</S>` in every sentence, function words: 64 GMB news sentences
        with their boundaries hold 1,611 positions and 685 distinct rows): the distinct rows go through
        `encode_tokens` once and are gathered back, so the gradient of a repeated token is the sum over its
        occurrences (the gather's gradient). Same values as `call` within float rounding. On every backend (inside
        `jax.jit` too: `jnp.unique` with a static size, the rows past the distinct ones skipped in chunks).
        """
        try:
            return backends.encode_distinct(self, char_ids)
        except NotImplementedError:
            return self._encode_all(self._check_ids(char_ids, None))

    def call(self, inputs):
        char_ids = self._check_ids(inputs, 3)
        try:  # TensorFlow: only the real tokens are encoded
            return backends.encode_real_tokens(self, char_ids)
        except NotImplementedError:
            return self._encode_all(char_ids)

    def compute_mask(self, inputs, mask=None):
        return ops.any(ops.greater(inputs, 0), axis=-1)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.projection_dim,)

    def get_config(self):
        config = super().get_config()
        config.update(
            filters=[list(f) for f in self.filters],
            num_highway=self.num_highway,
            projection_dim=self.projection_dim,
            char_embedding_dim=self.char_embedding_dim,
            num_chars=self.num_chars,
            max_chars=self.max_chars,
            activation=keras.activations.serialize(self.activation),
            pad_id=self.pad_id,
            word_vocab_size=self.word_vocab_size,
            word_embedding_dim=self.word_embedding_dim,
            always_project=self.always_project,
            precision=self.requested_precision,
        )
        return config
