"""ELMoSavedModel: an exported ELMo SavedModel as a Keras 3 layer that can be fine-tuned."""

import os
import re

import keras

# tf.Variable names end in ":<output index>" ("bilm/forward_lstm_0/bias:0"); TF name scopes reject ":".
_TF_OUTPUT_INDEX = re.compile(r":\d+$")
# what `tf.name_scope` accepts after its first character (tensorflow/python/framework/ops.py), without "/"
_SCOPE_SAFE = re.compile(r"[A-Za-z0-9_.\->]*")


def keras_variable_name(tf_name):
    """`"bilm/forward_lstm_0/bias:0"` -> `"bilm_forward_lstm_0_bias"`: a name Keras variables and TF name scopes
    (hence optimizer slots such as `"<name>_momentum"`) accept."""
    return _TF_OUTPUT_INDEX.sub("", tf_name).replace("/", "_").replace(":", "_")


def _endpoint_output_keys(fn):
    """The sorted output names of a loaded endpoint returning a dict, else None."""
    for concrete in getattr(fn, "concrete_functions", None) or [fn]:
        outputs = getattr(concrete, "structured_outputs", None)
        if isinstance(outputs, dict):
            return sorted(outputs)
    return None


@keras.saving.register_keras_serializable(package="elmo_tf")
class ELMoSavedModel(keras.layers.TFSMLayer):
    """An exported ELMo SavedModel (`elmo_tf.saved_model.export.export_elmo`) as a Keras 3 layer, frozen or fine-tuned.

    A `keras.layers.TFSMLayer` whose weights are the SavedModel's own variables (shared, not copied: training the
    layer changes what the loaded endpoints compute), named without tf.Variable's ":0" suffix
    (`"bilm_forward_lstm_0_bias"`). The stock `TFSMLayer(..., trainable=True)` keeps that suffix, and in Keras 3.15
    `fit` then fails when the optimizer creates its slots ("'char_cnn_char_embedding:0_momentum' is not a valid
    scope name"). Everything else is `TFSMLayer`'s: the graph comes from the SavedModel, only the endpoint is called,
    and there is no separate training-time behaviour unless `call_training_endpoint` names one.

    Saving: a model holding this layer saves to `.keras` with the (fine-tuned) weight values, but the graph is
    read again from `filepath` when loading, so the SavedModel must still be there. Loading runs the SavedModel's
    graph code, so Keras refuses it by default, as for `TFSMLayer`: pass `safe_mode=False` to
    `keras.saving.load_model` (or to `from_config`) for a SavedModel you trust.

    Args:
        filepath: an export's version directory (`<base>/<version>/`), str or path-like.
        call_endpoint: the endpoint to call: "default" (also "serving_default": raw sentences, tokenized in the
            graph) or "tokens" (pre-tokenized sentences).
        output_keys: None to return every output of the endpoint, or a tuple of output names to return only those
            (e.g. `("default",)`: the cheapest dict to carry when a head needs one sentence vector).
        call_training_endpoint: optional endpoint called instead when `training=True` (the export has none).
        trainable: whether fitting updates the ELMo weights (char CNN, highway, projection, biLM LSTMs, ScalarMix).
        name: layer name; default "elmo_saved_model", then "elmo_saved_model_1", ...
        dtype: layer dtype policy; the SavedModel's graph computes in its own dtype (float32) whatever it is.
    Call arguments:
        inputs: for "default": tf.string `(batch,)` sentences. For "tokens": a dict
            `{"tokens": tf.string (batch, tokens) padded with "", "sequence_len": int32 (batch,)}`.
        training: calls `call_training_endpoint` when True and one was given.
    Returns:
        a dict of the selected outputs, with `T` the longest sentence of the batch and `P` the projection size:
        `word_emb` float32 `(batch, T, P)`; `lstm_outputs1`... float32 `(batch, T, 2P)`; `elmo` float32
        `(batch, T, 2P)` (the learned mix); `default` float32 `(batch, 2P)` (the mean of `elmo` over real tokens);
        `sequence_len` int32 `(batch,)`; `mask` bool `(batch, T)`, True for real tokens. Padded positions are 0.

    Example:

    ```python
    sentences = keras.Input((), dtype="string")
    elmo = ELMoSavedModel("models/elmo/1", output_keys=("default",), trainable=True)
    logits = keras.layers.Dense(2)(elmo(sentences)["default"])
    classifier = keras.Model(sentences, logits)
    classifier.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    classifier.fit(tf.data.Dataset.from_tensor_slices((texts, labels)).batch(32), epochs=3)
    classifier.save("classifier.keras")  # load_model("classifier.keras", safe_mode=False) needs models/elmo/1
    ```
    """

    def __init__(
        self,
        filepath,
        call_endpoint="default",
        output_keys=None,
        call_training_endpoint=None,
        trainable=True,
        name=None,
        dtype=None,
    ):
        if output_keys is not None:
            keys = tuple(output_keys) if isinstance(output_keys, list | tuple) else None
            if keys is None or not all(isinstance(key, str) for key in keys):
                raise ValueError(
                    f"output_keys must be None or a tuple of output names such as ('elmo',), got {output_keys!r}"
                )
            output_keys = keys
            if not output_keys:
                raise ValueError("output_keys must name at least one output, got ()")
        if name is None:  # Keras would derive "el_mo_saved_model" from the class name
            uid = keras.backend.get_uid("elmo_saved_model")
            name = "elmo_saved_model" if uid == 1 else f"elmo_saved_model_{uid - 1}"
        super().__init__(
            os.fspath(filepath),
            call_endpoint=call_endpoint,
            call_training_endpoint=call_training_endpoint,
            trainable=trainable,
            name=name,
            dtype=dtype,
        )
        self.output_keys = output_keys
        bad = [w.name for w in self.weights if not _SCOPE_SAFE.fullmatch(w.name)]
        if bad:
            raise RuntimeError(
                f"ELMoSavedModel: weights named {bad[:3]} cannot get optimizer slots. keras.layers.TFSMLayer no longer "
                f"wraps the SavedModel's variables through _add_existing_weight (written for Keras 3.15.1, "
                f"running Keras {keras.__version__}); this layer needs updating."
            )
        if output_keys is not None:
            fns = [self.call_endpoint_fn] + ([self.call_training_endpoint_fn] if call_training_endpoint else [])
            for fn in fns:
                available = _endpoint_output_keys(fn)
                missing = [key for key in output_keys if available is None or key not in available]
                if missing:
                    raise ValueError(
                        f"output_keys: {missing} not among the outputs of the endpoint of {self.filepath!r}: "
                        f"{available}"
                    )

    def _add_existing_weight(self, weight):
        # Overrides a private method of keras.layers.TFSMLayer (Keras 3.15.1, keras/src/export/tfsm_layer.py), which
        # TFSMLayer.__init__ calls for every variable of the endpoints. Keras names the wrapper
        # `weight.name.replace("/", "_")`, which keeps tf.Variable's ":0"; optimizer slots are named after it and
        # tf.name_scope rejects the ":". Same wrapper (it shares the tf.Variable), name without ":0".
        # tests/export/test_fine_tune.py::test_elmo_saved_model_weights_are_the_saved_model_variables fails if Keras
        # stops calling this method or stops sharing the variable. Layer._track_variable is private too (TFSMLayer's
        # own _add_existing_weight uses it).
        self._track_variable(
            keras.Variable(
                initializer=weight,
                trainable=weight.trainable,
                dtype=weight.dtype,
                shape=weight.shape,
                name=keras_variable_name(weight.name),
            )
        )

    def call(self, inputs, training=False, **kwargs):
        fn = self.call_training_endpoint_fn if training and self.call_training_endpoint else self.call_endpoint_fn
        # a dict feeds an endpoint with several named inputs ("tokens": tokens, sequence_len)
        outputs = fn(**inputs, **kwargs) if isinstance(inputs, dict) else fn(inputs, **kwargs)
        if self.output_keys is None:
            return dict(outputs)
        return {key: outputs[key] for key in self.output_keys}

    def get_config(self):
        config = super().get_config()
        config["output_keys"] = None if self.output_keys is None else list(self.output_keys)
        return config
