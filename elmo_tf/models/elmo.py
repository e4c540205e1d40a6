"""The ELMo encoder: char ids -> every biLM layer's activations, mask, lengths and named mixes."""

import hashlib
import json
import os

import keras
import numpy as np
from keras import ops

from elmo_tf.config import BiLMConfig
from elmo_tf.io.bilm_hdf5 import check_weight_file, load_bilm_weights, save_bilm_weights
from elmo_tf.layers import backends, low_precision
from elmo_tf.layers.bilm import BiLM
from elmo_tf.layers.char_cnn import CharCNN
from elmo_tf.layers.scalar_mix import ScalarMix
from elmo_tf.layers.tokens_to_char_ids import char_mapping
from elmo_tf.preprocessing.char_rows import sentences_to_char_ids
from elmo_tf.preprocessing.chars import MAX_CHARS, add_sentence_boundaries


def build_bilm_layers(config, dropout=0.0, implementation="auto", matmul_dtype=None, precision="float32"):
    """The built `CharCNN` ("char_cnn") and `BiLM` ("bilm") of a `BiLMConfig`, named as the weight converter expects;
    `implementation` and `matmul_dtype` are the `BiLM`'s, `precision` both layers' (`elmo_tf.precision`).

    Built right away, so models holding them never show loaders and savers a half-built state.
    """
    char_cnn = CharCNN(
        config.filters,
        config.num_highway,
        config.projection_dim,
        config.char_embedding_dim,
        num_chars=config.num_characters,
        max_chars=config.max_characters_per_token,
        activation=config.activation,
        precision=precision,
        name="char_cnn",
        **_char_cnn_options(config),
    )
    bilm = BiLM(
        config.num_layers,
        config.lstm_dim,
        config.projection_dim,
        cell_clip=config.cell_clip,
        proj_clip=config.proj_clip,
        use_skip_connections=config.use_skip_connections,
        dropout=dropout,
        implementation=implementation,
        matmul_dtype=matmul_dtype,
        precision=precision,
        name="bilm",
    )
    char_cnn.build((None, None, char_cnn.input_width))
    bilm.build((None, None, config.projection_dim))
    return char_cnn, bilm


def _char_cnn_options(config):
    """The `CharCNN` arguments of ELMoForManyLangs' numerics (none for a bilm-tf config: its defaults)."""
    if config.char_vocabulary is None:
        return {"always_project": True} if config.always_project else {}
    words = config.num_words + 1 if config.word_embedding_dim else 0  # + the zero row of "no token"
    return {
        "pad_id": dict(config.char_special_ids)["pad"] + 1,
        "word_vocab_size": words,
        "word_embedding_dim": config.word_embedding_dim,
        "always_project": config.always_project,
    }


def elmo_activations(word_emb, lstm_outputs):
    """ELMo's L+1 layers in order: the token layer `(..., P)` duplicated to `(..., 2P)` (both halves of the biLM read
    it), then each LSTM layer's `(..., 2P)` (forward and backward halves). The layout of `ELMo`'s `activations`, of
    `embed --layers all` and of the SavedModel's outputs stacked (`contract.activations_from_outputs`)."""
    return [ops.concatenate([word_emb, word_emb], axis=-1), *lstm_outputs]


@keras.saving.register_keras_serializable(package="elmo_tf")
class ELMo(keras.Model):
    """ELMo (Peters et al. 2018): `CharCNN` token vectors -> `BiLM` -> `ScalarMix` per named mix.

    Sentence boundaries are added around every sentence before the char CNN and removed from all
    outputs, as the original does. Stateless by default (zero initial state, so a sentence gets the
    same vectors in any batch); pass `initial_state` / `return_state=True` for continuity. The char CNN
    encodes each distinct token of a batch once (`CharCNN.encode_distinct`).

    Args:
        config: a `BiLMConfig` or its options dict (bilm-tf options.json layout).
        mixes: names of the ScalarMix outputs to compute (default `("elmo",)`).
        mix_layer_norm: per-sentence layer norm inside each mix.
        dropout: biLM dropout in training.
        implementation: the biLM's loop (`BiLM`'s argument: "auto", "scan", "fast_gradient", "ops").
        matmul_dtype: the biLM's matmul dtype (`BiLM`'s argument; with "ops", e.g. "bfloat16" on a GPU).
        precision: "float32" (default: the original numbers), "bfloat16" (matmuls and convolutions on bfloat16 copies
            of the weights, converted once, float32 accumulation and outputs) or "auto" (bfloat16 where the CPU has
            a bfloat16 unit): docs/precision.md. The config keeps the value asked, `precision` the computed one.
    Call arguments:
        inputs: int32 char ids `(batch, tokens, 50)`, all-zero rows for padding (left-aligned), without
            sentence boundaries (see `elmo_tf.preprocessing.tokens_to_char_ids`).
        initial_state / return_state: see `BiLM`.
        token_ids: optional int32 `(batch, tokens)` from `token_ids(tokens)` once `use_token_embeddings` attached
            a cache: where > 0 the token's vector is taken from the cache (row id - 1) instead of the char CNN; 0
            (unknown words, padding) goes through the char CNN. `embed_tokens` passes them itself.
    Returns:
        dict with `activations` (list of L+1 float `(batch, tokens, 2P)`: the token layer duplicated,
        then each LSTM layer; zeros at padding), `word_emb` `(batch, tokens, P)`, `lstm_outputs{l}`
        (l = 1..L), one entry per mix name `(batch, tokens, 2P)`, `default` (the mean of the first mix over
        real tokens, `(batch, 2P)`), `mask` bool `(batch, tokens)`, `sequence_len` int32 `(batch,)`, and
        `final_state` with `return_state`.
    """

    def __init__(
        self,
        config=None,
        mixes=("elmo",),
        mix_layer_norm=False,
        dropout=0.0,
        implementation="auto",
        matmul_dtype=None,
        precision="float32",
        **kwargs,
    ):
        kwargs.setdefault("name", "elmo")
        super().__init__(**kwargs)
        self.requested_precision, self.precision = low_precision.layer_precision(precision)
        if config is None:
            config = BiLMConfig()
        elif isinstance(config, dict):
            config = BiLMConfig.from_options(config)
        elif not isinstance(config, BiLMConfig):
            raise TypeError(f"config must be a BiLMConfig or an options dict, got {type(config).__name__}")
        if isinstance(mixes, str):
            mixes = (mixes,)
        mixes = tuple(mixes)
        reserved = {"activations", "word_emb", "mask", "sequence_len", "default", "final_state"}
        for name in mixes:
            if name in reserved or name.startswith("lstm_outputs"):
                raise ValueError(f"mix name {name!r} collides with an output key ({sorted(reserved)})")
        self.config = config
        self.mixes = mixes
        self.mix_layer_norm = bool(mix_layer_norm)
        self.dropout = float(dropout)
        self.char_cnn, self.bilm = build_bilm_layers(config, dropout, implementation, matmul_dtype, self.precision)
        self.char_mapping = char_mapping(config)  # strings -> this model's char ids (its lookup tables, if any)
        self.scalar_mixes = [
            ScalarMix(config.num_layers + 1, layer_norm=mix_layer_norm, name=f"mix_{name}") for name in mixes
        ]
        for mix in self.scalar_mixes:
            mix.build([(None, None, 2 * config.projection_dim)] * (config.num_layers + 1))
        self.built = True
        self._post_build()  # as Keras after a build: PyTorch's backend registers the weights as the module's parameters

    @property
    def num_output_layers(self):
        return self.config.num_layers + 1

    @property
    def boundary_rows(self):
        """The ids of the `<S>` and `</S>` tokens put around every sentence (this model's mapping's)."""
        return self.char_mapping.bos_row, self.char_mapping.eos_row

    @property
    def token_cache(self):
        """The attached `TokenCache` (`use_token_embeddings`), or None."""
        return getattr(self, "_token_cache", None)

    def use_token_embeddings(self, vocabulary, embedding=None):
        """Attaches a token-embedding cache: a `elmo_tf.io.token_cache.TokenCache`, or `vocabulary` (tokens, bytes or
        str) and their precomputed token vectors `embedding` `(len(vocabulary), projection_dim)`
        (`elmo_tf.io.token_embeddings`, the bilm-tf / AllenNLP layout). Calls with `token_ids` (and `embed_tokens`)
        then skip the char CNN for those words; outputs stay those of the char CNN within float rounding as long as
        the cache was computed from this model's weights. The cache is for inference: it is not part of the config
        nor of `.keras` files, and a trained char CNN makes it stale. `use_token_embeddings(None)` detaches it."""
        if vocabulary is None and embedding is None:
            self._token_cache = None
            return
        try:
            backends.accepts_string_tensors()  # the cache's lookup table is TensorFlow's
        except NotImplementedError:
            raise ValueError(
                f"use_token_embeddings needs the TensorFlow backend (its lookup table is TensorFlow's); Keras runs on "
                f"{keras.config.backend()!r}"
            ) from None
        from elmo_tf.io.token_cache import TokenCache

        value = vocabulary if embedding is None else (vocabulary, embedding)
        cache = TokenCache.of(value, self.config.projection_dim, name="embedding")
        cache.in_graph()  # its table and vectors are created now, outside any traced function
        self._token_cache = cache

    def token_ids(self, tokens):
        """tf.string `(batch, tokens)` -> int32 `(batch, tokens)`: 1 + the token's row in the attached cache, 0 for
        words it does not hold and for padding ("")."""
        if self.token_cache is None:
            raise ValueError("token_ids needs a token-embedding cache: call use_token_embeddings first")
        return self.token_cache.lookup(tokens)

    def call(self, inputs, initial_state=None, return_state=False, training=None, token_ids=None):
        char_ids = ops.convert_to_tensor(inputs)
        dtype = keras.backend.standardize_dtype(char_ids.dtype)
        if not keras.backend.is_int_dtype(dtype):
            raise TypeError(f"ELMo inputs must be integer char ids (batch, tokens, {MAX_CHARS}), got dtype {dtype}")
        width = self.char_cnn.input_width
        if len(char_ids.shape) != 3 or char_ids.shape[-1] not in (None, width):
            raise ValueError(f"ELMo inputs must have shape (batch, tokens, {width}), got {tuple(char_ids.shape)}")
        char_ids = ops.cast(char_ids, "int32")
        mask = ops.any(char_ids > 0, axis=-1)
        with_bounds = add_sentence_boundaries(char_ids, *self.boundary_rows)
        mask_bounds = ops.any(with_bounds > 0, axis=-1)
        if token_ids is None:
            tokens = self.char_cnn.encode_distinct(with_bounds)
        else:
            if self.token_cache is None:
                raise ValueError("token_ids given but no token-embedding cache is attached (use_token_embeddings)")
            # a cache exists on the TensorFlow backend only (use_token_embeddings)
            tokens = backends.encode_cached_tokens(self.char_cnn, self.token_cache, with_bounds, token_ids, mask)
        result = self.bilm(
            tokens, mask=mask_bounds, initial_state=initial_state, return_state=return_state, training=training
        )
        lstm_layers, states = result if return_state else (result, None)
        float_mask = ops.cast(mask, tokens.dtype)[:, :, None]

        def strip(x):  # drop <S> and </S>: real tokens sit at 1..n, </S> lands on a masked slot
            return x[:, 1:-1] * float_mask

        word_emb = strip(tokens)
        activations = elmo_activations(word_emb, [strip(x) for x in lstm_layers])
        outputs = {
            "activations": activations,
            "word_emb": word_emb,
            "mask": mask,
            "sequence_len": ops.sum(ops.cast(mask, "int32"), axis=1),
        }
        for layer, x in enumerate(activations[1:], start=1):
            outputs[f"lstm_outputs{layer}"] = x
        for name, mix in zip(self.mixes, self.scalar_mixes):
            outputs[name] = mix(activations, mask=mask)
        if self.mixes:
            first = outputs[self.mixes[0]]
            count = ops.maximum(ops.sum(float_mask, axis=1), 1.0)
            outputs["default"] = ops.sum(first, axis=1) / count
        if return_state:
            outputs["final_state"] = states
        return outputs

    def embed_tokens(self, tokens, **kwargs):
        """Calls the model on a tf.string `(batch, tokens)` tensor padded with "" (through the attached token cache,
        if any). On JAX and PyTorch: on tokens as Python strings, a list of sentences (lists of `str`/`bytes`, of any
        lengths) or a NumPy array padded with "", mapped by `char_mapping.numpy`."""
        if self.token_cache is not None and "token_ids" not in kwargs:  # never off TensorFlow (use_token_embeddings)
            kwargs["token_ids"] = self.token_ids(tokens)
        return self(self.tokens_to_char_ids(tokens), **kwargs)

    def tokens_to_char_ids(self, tokens):
        """tf.string tokens `(...)`, "" for padding -> this model's char ids `(..., input width)`: bilm-tf's byte
        mapping (`elmo_tf.preprocessing.tokens_to_char_ids`), or a converted ELMoForManyLangs model's vocabulary
        lookup (`elmo_tf.preprocessing.char_vocabulary`). On JAX and PyTorch: Python strings, as `embed_tokens` takes
        them -> int32 NumPy `(batch, tokens, input width)`."""
        try:
            return backends.string_char_ids(self.char_mapping, tokens)
        except NotImplementedError:
            return sentences_to_char_ids(self.char_mapping, tokens)

    def get_config(self):
        config = super().get_config()
        config.update(
            config=self.config.to_options(),
            mixes=list(self.mixes),
            mix_layer_norm=self.mix_layer_norm,
            dropout=self.dropout,
            implementation=self.bilm.implementation,
            matmul_dtype=self.bilm.matmul_dtype,
            precision=self.requested_precision,
        )
        frozen = [key for key, layer in self._parts().items() if not layer.trainable]
        if frozen:  # `elmo.bilm.trainable = False` is part of the model: it survives .keras saving
            config["frozen"] = frozen
        return config

    def _parts(self):
        parts = {"char_cnn": self.char_cnn, "bilm": self.bilm}
        parts.update((f"mix_{name}", mix) for name, mix in zip(self.mixes, self.scalar_mixes))
        return parts

    @classmethod
    def from_preset(cls, preset, cache_dir=None, quiet=False, **kwargs):
        """An `ELMo` with the weights of `preset`: a released model's name (`elmo-tf models` lists them: "original",
        "small", "efml-de", "tf-hub", ...), a local directory holding options.json and weights.hdf5, or a URL of
        such a directory or of an ELMoForManyLangs zip / TF Hub tarball, as keras-hub's `from_preset`. A name or a
        URL is downloaded once into the cache (`elmo_tf.presets`: verified, resumable, offline afterwards) and
        converted when it is not in bilm-tf's format (a progress bar on stderr unless `quiet`). A TF Hub module's
        learned mix (`scalar_mix.json`) becomes the "elmo" mix when `mixes` has one of that name. `kwargs` go to
        `ELMo(...)` (mixes, dropout, precision, ...).

        Raises:
            PresetError, DownloadError, OfflineError (elmo_tf.presets): a preset that cannot be found or fetched;
                ConfigError, WeightFileError: files that do not make a model. Each names the file and the model.

        Example:
            elmo = ELMo.from_preset("original")
            elmo = ELMo.from_preset("efml-de", mixes=("ner",))
        """
        from elmo_tf.presets import preset_files

        files = preset_files(preset, cache_dir=cache_dir, quiet=quiet)
        config = BiLMConfig.from_json(files["options"])
        check_weight_file(config, files["weights"])  # the file's shapes (metadata) before any tensor is allocated
        model = cls(config, **kwargs)
        load_bilm_weights(model, files["weights"])
        weights_loaded(model)
        mix_path = os.path.join(os.path.dirname(files["options"]), "scalar_mix.json")
        if os.path.isfile(mix_path) and "elmo" in model.mixes:
            from elmo_tf.convert.tf_hub import load_scalar_mix

            load_scalar_mix(model.scalar_mixes[model.mixes.index("elmo")], mix_path)
        return model

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        frozen = config.pop("frozen", [])
        model = cls(**config)
        parts = model._parts()
        for key in frozen:
            if key not in parts:
                raise ValueError(f"frozen: unknown part {key!r}; ELMo has {sorted(parts)}")
            parts[key].trainable = False
        return model


def load_elmo(options_path, weights_path=None, **elmo_kwargs):
    """Builds an `ELMo` model from a bilm-tf `options.json` and loads `weights.hdf5` into it; with one argument that
    is a directory, a released model's name ("original") or a URL, `ELMo.from_preset(options_path)` (downloaded
    once, verified, cached). `elmo_kwargs` go to `ELMo(...)`, e.g. `precision="bfloat16"` (the bfloat16 copies of
    the weights are converted once, right after loading).

    Raises:
        ConfigError: a bad options file (elmo_tf.config); WeightFileError: a bad weight file, one that points
            outside itself, or one whose dataset shapes are not those the options imply (checked from the file's
            metadata before the model is built). Both are ValueErrors whose message names the file and the key or
            dataset.

    Example:
        elmo = load_elmo("options.json", "weights.hdf5")
        elmo = load_elmo("original")  # AllenNLP's original English model, downloaded once into the cache
        elmo = load_elmo("options.json", "weights.hdf5", precision="auto")  # bfloat16 where the CPU has it
        out = elmo.embed_tokens(tf.constant([["Hello", "world", "."]]))
    """
    if weights_path is None:
        from elmo_tf.presets import is_preset

        if os.path.isdir(options_path) or is_preset(options_path):
            return ELMo.from_preset(options_path, **elmo_kwargs)
    config = BiLMConfig.from_json(options_path)
    if weights_path is not None:
        check_weight_file(config, weights_path)  # the file's shapes (metadata) before any tensor is allocated
    model = ELMo(config, **elmo_kwargs)
    if weights_path is not None:
        load_bilm_weights(model, weights_path)
        weights_loaded(model)
    return model


def weights_loaded(model):
    """Converts the bfloat16 copies of a model computing in bfloat16 (`precision`) once its weights are loaded
    (`load_bilm_weights`; `load_softmax_weights`, which writes slices of the variables underneath): now, eagerly, so
    that no call converts them and an export holds them up to date. Nothing for a float32 model."""
    low_precision.weights_changed(model)
    low_precision.refresh(model)


def save_elmo(model, output_dir):
    """Writes `options.json` and `weights.hdf5` for an `ELMo` model into `output_dir`."""
    os.makedirs(output_dir, exist_ok=True)
    model.config.to_json(os.path.join(output_dir, "options.json"))
    save_bilm_weights(model, os.path.join(output_dir, "weights.hdf5"))


def model_fingerprint(model):
    """sha256 (hex) of what a biLM's outputs depend on: its options and the values of its char CNN and biLM weights
    (name, dtype, shape, bytes; not where they were read from, not the scalar mixes). For an `ELMo`, a
    `LanguageModel` (its softmax is hashed apart), anything with `config`, `char_cnn` and `bilm`: the NER feature
    cache, embed's and score's resume journals."""
    digest = hashlib.sha256(json.dumps(model.config.to_options(), sort_keys=True, default=str).encode())
    for layer in (model.char_cnn, model.bilm):
        for variable in layer.weights:
            value = np.ascontiguousarray(np.asarray(variable.numpy()))
            digest.update(f"{variable.path}:{value.dtype.str}:{value.shape}".encode())
            digest.update(memoryview(value).cast("B"))
    return digest.hexdigest()
