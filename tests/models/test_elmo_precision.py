"""elmo_tf/models/elmo.py's `precision` (issue 51): the setting on `ELMo`, `load_elmo` and `from_preset`, what its
config keeps, bfloat16's outputs against float32's, the bfloat16 copies converted once (at load, and again only when
the weights change: an assign, `load_weights`, a training step), padding invariance and the token cache in bfloat16."""

import keras
import numpy as np
import pytest

from elmo_tf.embed import Embedder
from elmo_tf.layers import low_precision
from elmo_tf.models import ELMo, load_elmo
from elmo_tf.models.elmo import save_elmo
from elmo_tf.precision import PrecisionError, resolve_precision

SENTENCES = [["The", "cat", "sat", "."], ["Hi"], ["naïve", "日本語", "tokens", "here", "and", "more"]]
KEYS = ("word_emb", "lstm_outputs1", "lstm_outputs2", "elmo", "default")
# bfloat16 against float32, the tiny model's random weights: max |diff| over the float32 output's largest magnitude.
# Measured on the AVX2 EPYC: word_emb 0.0038, lstm_outputs1 0.0048, lstm_outputs2 0.0037, elmo 0.0051, default 0.0026.
MODEL_BOUND = 0.02


def arrays(outputs):
    return {k: ([np.asarray(a) for a in v] if isinstance(v, list) else np.asarray(v)) for k, v in outputs.items()}


def _holders(model):
    return [
        getattr(layer, low_precision.HOLDER) for layer in model._flatten_layers() if hasattr(layer, "_low_precision")
    ]


def _conversions(model):
    return [int(h.conversions.numpy()) for h in _holders(model)]


def _twin(model, precision="bfloat16"):
    twin = ELMo.from_config(dict(model.get_config(), precision=precision))
    twin.set_weights(model.get_weights())
    return twin


def test_precision_is_a_saved_argument_and_the_attribute_is_computed(make_elmo):
    for asked in ("float32", "bfloat16", "auto"):
        model = make_elmo(precision=asked, randomize=False)
        assert model.get_config()["precision"] == asked
        assert model.precision == resolve_precision(asked) == model.char_cnn.precision == model.bilm.precision
        assert ELMo.from_config(model.get_config()).get_config()["precision"] == asked
    assert make_elmo(randomize=False).precision == "float32"
    with pytest.raises(PrecisionError, match="precision must be one of float32, bfloat16, auto; got 'bf16'") as e:
        make_elmo(precision="bf16")
    assert e.value.key == "precision"


def test_bfloat16_outputs_are_float32_and_within_bfloat16_error(tiny_elmo, to_char_ids):
    ids = to_char_ids(SENTENCES)
    want, got = arrays(tiny_elmo(ids)), arrays(_twin(tiny_elmo)(ids))
    for key in KEYS:
        assert got[key].dtype == np.float32, key
        scale = np.abs(want[key]).max()
        assert 0 < np.abs(got[key] - want[key]).max() <= MODEL_BOUND * scale, key
    np.testing.assert_array_equal(got["mask"], want["mask"])
    np.testing.assert_array_equal(got["sequence_len"], want["sequence_len"])


def test_load_elmo_and_from_preset_take_the_precision(tiny_elmo, to_char_ids, tmp_path):
    """The copies are converted right after the weights load (an export then holds them up to date, and no call
    converts them); the outputs are those of the same weights set by hand."""
    save_elmo(tiny_elmo, tmp_path / "model")
    ids = to_char_ids(SENTENCES)
    want = arrays(_twin(tiny_elmo)(ids))
    loaded = [
        load_elmo(tmp_path / "model" / "options.json", tmp_path / "model" / "weights.hdf5", precision="bfloat16"),
        ELMo.from_preset(str(tmp_path / "model"), precision="bfloat16"),
        load_elmo(str(tmp_path / "model"), precision="bfloat16"),
    ]
    for model in loaded:
        assert model.precision == "bfloat16"
        assert not any(bool(h.stale.numpy()) for h in _holders(model))
        before = _conversions(model)
        got = arrays(model(ids))
        assert _conversions(model) == before
        for key in ("word_emb", "lstm_outputs1", "lstm_outputs2"):  # weights.hdf5 holds no scalar mix
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    with pytest.raises(PrecisionError, match="got 'fast'"):
        load_elmo(tmp_path / "model" / "options.json", tmp_path / "model" / "weights.hdf5", precision="fast")


def test_copies_are_converted_once_not_per_call_and_again_after_load_weights(make_elmo, to_char_ids, tmp_path):
    model = make_elmo(precision="bfloat16")
    ids = to_char_ids(SENTENCES)
    model(ids)
    converted = _conversions(model)
    assert len(converted) == 2 + 4  # char CNN, highway, 2 layers x 2 directions of cells
    embedder = Embedder(model, "all")
    for _ in range(2):
        model(ids)
        embedder.embed_batch(SENTENCES)
    assert _conversions(model) == converted
    other = make_elmo(seed=7)
    other.save_weights(tmp_path / "other.weights.h5")
    model.load_weights(tmp_path / "other.weights.h5")
    got = arrays(model(ids))
    assert _conversions(model) == [n + 1 for n in converted]
    want = arrays(_twin(other)(ids))
    for key in KEYS:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_keras_round_trip_keeps_the_precision(make_elmo, to_char_ids, tmp_path):
    model = make_elmo(precision="bfloat16")
    ids = to_char_ids(SENTENCES)
    path = tmp_path / "elmo.keras"
    keras.saving.save_model(model, path)
    loaded = keras.saving.load_model(path)
    assert loaded.precision == "bfloat16" and loaded.get_config()["precision"] == "bfloat16"
    assert [w.dtype for w in loaded.weights] == ["float32"] * len(model.weights)  # the file holds float32 weights
    a, b = arrays(model(ids)), arrays(loaded(ids))
    for key in KEYS:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_training_through_a_bfloat16_elmo_then_inference_reads_the_trained_weights(make_elmo, to_char_ids):
    """`fit` trains the float32 weights through the bfloat16 copies (their gradients), and the next inference call
    converts the copies again: its outputs are those of a model given the trained weights."""
    model = make_elmo(precision="bfloat16")
    inputs = keras.Input(shape=(None, 50), dtype="int32")
    tagger = keras.Model(inputs, keras.layers.Dense(3, name="tags")(model(inputs)["elmo"]))
    tagger.compile(keras.optimizers.SGD(0.5), "mse")
    ids = to_char_ids(SENTENCES)
    before = [w.numpy().copy() for w in model.char_cnn.weights + model.bilm.weights]
    tagger.fit(ids, np.ones((3, 6, 3), np.float32), batch_size=3, epochs=2, verbose=0)
    after = [w.numpy() for w in model.char_cnn.weights + model.bilm.weights]
    assert max(np.abs(a - b).max() for a, b in zip(after, before)) > 1e-4
    got, want = arrays(model(ids)), arrays(_twin(model)(ids))
    for key in KEYS:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_padding_invariance_in_bfloat16(make_elmo, to_char_ids):
    """A sentence alone, padded and batched with longer ones gets the same vectors (exactly where TF's bfloat16
    matmul is emulated, as on the AVX2 EPYC; to bfloat16's error where a CPU's own kernels may sum rows of different
    batches in another order)."""
    model = make_elmo(precision="bfloat16")
    atol = 1e-6 if low_precision.emulated("matmul") else 1e-2
    sentence = SENTENCES[0]
    alone = arrays(model(to_char_ids([sentence])))
    others = [["x"] * 15, ["a", "much", "longer", "sentence", "with", "many", "tokens", "in", "it"]]
    batched = arrays(model(to_char_ids(others + [sentence], num_tokens=20)))
    n = len(sentence)
    for layer in range(3):
        np.testing.assert_allclose(batched["activations"][layer][2, :n], alone["activations"][layer][0], atol=atol)
        assert not batched["activations"][layer][2, n:].any()
    np.testing.assert_allclose(batched["default"][2], alone["default"][0], atol=atol)


def test_the_token_cache_serves_a_bfloat16_model(make_elmo):
    """A cache of the bfloat16 model's own token vectors gives what its char CNN gives."""
    import tensorflow as tf

    model = make_elmo(precision="bfloat16")
    words = ["The", "cat", "sat", "."]
    vectors = model.char_cnn.encode_distinct(model.char_mapping.numpy(words)).numpy()
    tokens = tf.constant([["The", "cat", "sat", ".", "dog"], ["cat", "", "", "", ""]])
    plain = arrays(model.embed_tokens(tokens))
    model.use_token_embeddings(words, vectors)
    cached = arrays(model.embed_tokens(tokens))
    for key in KEYS:
        np.testing.assert_allclose(cached[key], plain[key], atol=1e-6, err_msg=key)
