"""NER head on ELMo: ScalarMix over the biLM layers (+ optional own word/char features) -> biLSTM -> CRF."""

import keras
import tensorflow as tf

from elmo_tf.layers.char_cnn import CharCNN
from elmo_tf.layers.crf import CRF
from elmo_tf.layers.scalar_mix import ScalarMix
from elmo_tf.ner.tags import SCHEMES, allowed_transitions
from elmo_tf.preprocessing.chars import MAX_CHARS


@keras.saving.register_keras_serializable(package="elmo_tf")
class NERTagger(keras.Model):
    """biLSTM-CRF tagger (Peters et al. 2018, sec. 5: NER), fed by frozen biLM activations.

    Features per token: `ScalarMix` of the biLM layers (softmax weights, trainable or fixed `gamma`,
    optional L2 on the weights), concatenated with the tagger's own word embedding and char CNN when
    enabled; dropout; a biLSTM; a linear layer to tag potentials; a CRF with the tag scheme's
    transition constraints. Trained on the CRF negative log-likelihood; predicts Viterbi tags.

    Args:
        labels: tag strings (ids are positions), e.g. ["O", "B-PER", ...].
        scheme: "iob1" | "iob2" | "bioes": the labels' scheme (sets the CRF constraints).
        num_elmo_layers: L+1 biLM layers in `activations`; 0 for a tagger without ELMo.
        word_vocab_size: size of the tagger's own word embedding (0: none); ids 0 = padding, 1 = unknown.
        word_dim: its width.
        char_filters: filters of the tagger's own char CNN, e.g. ((3, 50),) (empty: none).
        lstm_units: biLSTM units per direction.
        dropout: on the features and on the biLSTM output.
        gamma: the ScalarMix's initial gamma.
        gamma_trainable: whether the ScalarMix's gamma trains.
        mix_l2: L2 on the ScalarMix's weights.
        mix_layer_norm: the ScalarMix's per-sentence layer norm.
    Call arguments:
        inputs: dict with `mask` bool `(batch, tokens)`, and as configured `activations` float
            `(batch, layers, tokens, dim)`, `word_ids` int32 `(batch, tokens)`, `char_ids` int32 `(batch, tokens, 50)`.
    Returns:
        int32 `(batch, tokens)` Viterbi tag ids (0 at padding). `potentials(inputs)` gives the CRF inputs.
    """

    def __init__(
        self,
        labels,
        scheme="bioes",
        num_elmo_layers=3,
        word_vocab_size=0,
        word_dim=100,
        char_filters=(),
        lstm_units=200,
        dropout=0.5,
        gamma=1.0,
        gamma_trainable=True,
        mix_l2=0.0,
        mix_layer_norm=False,
        **kwargs,
    ):
        kwargs.setdefault("name", "ner_tagger")
        super().__init__(**kwargs)
        if scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
        labels = list(labels)
        if len(labels) < 1 or len(set(labels)) != len(labels):
            raise ValueError(f"labels must be distinct tag strings, got {labels}")
        char_filters = tuple(tuple(int(v) for v in f) for f in char_filters)
        if num_elmo_layers == 0 and word_vocab_size == 0 and not char_filters:
            raise ValueError("the tagger needs features: num_elmo_layers > 0, word_vocab_size > 0 or char_filters")
        if not 0 <= dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        self.labels = labels
        self.scheme = scheme
        self.num_elmo_layers = int(num_elmo_layers)
        self.word_vocab_size = int(word_vocab_size)
        self.word_dim = int(word_dim)
        self.char_filters = char_filters
        self.lstm_units = int(lstm_units)
        self.dropout = float(dropout)
        self.gamma = float(gamma)
        self.gamma_trainable = bool(gamma_trainable)
        self.mix_l2 = float(mix_l2)
        self.mix_layer_norm = bool(mix_layer_norm)
        self.mix = (
            ScalarMix(
                self.num_elmo_layers,
                layer_norm=mix_layer_norm,
                initial_gamma=gamma,
                trainable_gamma=gamma_trainable,
                l2_coef=mix_l2,
                name="elmo_mix",
            )
            if self.num_elmo_layers
            else None
        )
        self.word_embedding = (
            keras.layers.Embedding(self.word_vocab_size, self.word_dim, name="word_embedding")
            if self.word_vocab_size
            else None
        )
        self.char_cnn = (
            CharCNN(
                char_filters,
                num_highway=0,
                projection_dim=sum(n for _, n in char_filters),
                char_embedding_dim=16,
                name="char_cnn",
            )
            if char_filters
            else None
        )
        self.feature_dropout = keras.layers.Dropout(dropout, name="feature_dropout")
        self.bilstm = keras.layers.Bidirectional(
            keras.layers.LSTM(self.lstm_units, return_sequences=True), name="bilstm"
        )
        self.output_dropout = keras.layers.Dropout(dropout, name="output_dropout")
        self.projection = keras.layers.Dense(len(labels), name="potentials")
        trans, start, end = allowed_transitions(labels, scheme)
        self.crf = CRF(len(labels), allowed_transitions=trans, allowed_start=start, allowed_end=end, name="crf")
        self.crf.build((None, None, len(labels)))  # used through its methods, not only by __call__
        self.loss_tracker = keras.metrics.Mean(name="loss")

    def _at_least_one(self, inputs, tags=None):
        """`(inputs, tags, batch, steps)` with the batch grown to at least one row and one time step: Keras's LSTM fails
        on a batch without rows or without steps (a batch of empty sentences), so such a batch gets a masked row or
        step (zeros), cut off again from the outputs. A batch with rows and steps passes unchanged."""
        mask = tf.cast(inputs["mask"], tf.bool)
        batch, steps = tf.shape(mask)[0], tf.shape(mask)[1]
        more_rows, more_steps = tf.maximum(1 - batch, 0), tf.maximum(1 - steps, 0)

        def grow(x, time_axis=1):
            x = tf.convert_to_tensor(x)
            pads = [[0, 0]] * x.shape.rank
            pads[0], pads[time_axis] = [0, more_rows], [0, more_steps]
            return tf.pad(x, pads)

        grown = {"mask": grow(mask)}
        if self.mix is not None:
            acts = tf.convert_to_tensor(inputs["activations"])
            if acts.shape.rank != 4:
                raise ValueError(f"activations must have shape (batch, layers, tokens, dim), got {acts.shape}")
            grown["activations"] = grow(acts, time_axis=2)
        if self.word_embedding is not None:
            grown["word_ids"] = grow(inputs["word_ids"])
        if self.char_cnn is not None:
            grown["char_ids"] = grow(inputs["char_ids"])
        return grown, None if tags is None else grow(tf.cast(tags, tf.int32)), batch, steps

    def _potentials(self, inputs, training=None):
        mask = inputs["mask"]
        features = []
        if self.mix is not None:
            acts = inputs["activations"]
            features.append(self.mix(tf.unstack(acts, num=self.num_elmo_layers, axis=1), mask=mask))
        if self.word_embedding is not None:
            features.append(self.word_embedding(inputs["word_ids"]))
        if self.char_cnn is not None:
            features.append(self.char_cnn(inputs["char_ids"]))
        x = features[0] if len(features) == 1 else tf.concat(features, axis=-1)
        x = self.feature_dropout(x, training=training)
        x = self.bilstm(x, mask=mask, training=training)
        x = self.output_dropout(x, training=training)
        return self.projection(x)

    def potentials(self, inputs, training=None):
        """CRF potentials, float `(batch, tokens, num_tags)`."""
        grown, _, batch, steps = self._at_least_one(inputs)
        return self._potentials(grown, training=training)[:batch, :steps]

    def call(self, inputs, training=None):
        grown, _, batch, steps = self._at_least_one(inputs)
        return self.crf.decode(self._potentials(grown, training=training), grown["mask"])[0][:batch, :steps]

    def negative_log_likelihood(self, inputs, tags, training=None):
        """Mean over sentences of `-log p(tags | inputs)` (0 for a batch without sentences), plus the layer losses (mix
        L2). An empty sentence adds 0."""
        grown, tags, batch, _ = self._at_least_one(inputs, tags)
        log_likelihood = self.crf.log_likelihood(self._potentials(grown, training=training), tags, grown["mask"])
        nll = -tf.math.divide_no_nan(tf.reduce_sum(log_likelihood[:batch]), tf.cast(batch, log_likelihood.dtype))
        return nll + tf.add_n(self.losses) if self.losses else nll

    def train_step(self, data):
        inputs, tags = data[0], data[1]
        with tf.GradientTape() as tape:
            loss = self.negative_log_likelihood(inputs, tags, training=True)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        self.loss_tracker.update_state(loss)
        return {"loss": self.loss_tracker.result()}

    def test_step(self, data):
        inputs, tags = data[0], data[1]
        self.loss_tracker.update_state(self.negative_log_likelihood(inputs, tags, training=False))
        return {"loss": self.loss_tracker.result()}

    @property
    def metrics(self):
        return [self.loss_tracker]

    def get_build_config(self):
        return {"activation_dim": getattr(self, "_activation_dim", None)}

    def build_from_config(self, config):
        # Keras's default would build from float placeholders; the char CNN needs int ids and the mix the width
        self.build_for(config.get("activation_dim", (config.get("input_shape") or {}).get("activations", [None])[-1]))

    def build_for(self, activation_dim=None):
        """Creates every weight by running a dummy batch (so weights can be loaded or counted)."""
        self._activation_dim = activation_dim
        dummy = {"mask": tf.ones([1, 2], tf.bool)}
        if self.num_elmo_layers:
            if activation_dim is None:
                raise ValueError("activation_dim is needed for a tagger with ELMo features")
            dummy["activations"] = tf.zeros([1, self.num_elmo_layers, 2, activation_dim])
        if self.word_vocab_size:
            dummy["word_ids"] = tf.zeros([1, 2], tf.int32)
        if self.char_filters:
            dummy["char_ids"] = tf.ones([1, 2, MAX_CHARS], tf.int32)
        self(dummy)
        self._build_optimizer()
        return self

    def compile(self, *args, **kwargs):
        super().compile(*args, **kwargs)
        self._build_optimizer()

    def _build_optimizer(self):
        """Creates the optimizer's variables once the model's exist (built and compiled, in either order): a first
        train step that creates them makes `fit` trace the train function twice (1.5 s of every fit of a small
        tagger on 2 cores). Keras does the same when it reloads a compiled model (`compile_from_config`), not when
        a new model is compiled and fitted."""
        optimizer = getattr(self, "optimizer", None)
        if self.built and optimizer is not None and not optimizer.built:
            optimizer.build(self.trainable_variables)

    def get_config(self):
        config = super().get_config()
        config.update(
            labels=self.labels,
            scheme=self.scheme,
            num_elmo_layers=self.num_elmo_layers,
            word_vocab_size=self.word_vocab_size,
            word_dim=self.word_dim,
            char_filters=[list(f) for f in self.char_filters],
            lstm_units=self.lstm_units,
            dropout=self.dropout,
            gamma=self.gamma,
            gamma_trainable=self.gamma_trainable,
            mix_l2=self.mix_l2,
            mix_layer_norm=self.mix_layer_norm,
        )
        return config

    @classmethod
    def from_config(cls, config):
        return cls(**config)
