"""elmo_tf/models/elmo.py: char ids -> activations, word_emb, lstm_outputs, mixes, default, mask, lengths."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from layer_testlib import rewrite_keras_weights

from elmo_tf.embed import Embedder
from elmo_tf.layers.char_cnn import CharCNN
from elmo_tf.models import ELMo
from elmo_tf.models.elmo import elmo_activations
from elmo_tf.preprocessing.chars import tokens_to_char_ids_numpy
from elmo_tf.saved_model import contract

SENTENCES = [["The", "cat", "sat", "."], ["Hi"], ["naïve", "日本語", "tokens", "here", "and", "more"]]
P = 8  # projection_dim of the tiny config
L = 2


def arrays(outputs):
    return {k: ([np.asarray(a) for a in v] if isinstance(v, list) else np.asarray(v)) for k, v in outputs.items()}


def test_output_keys_shapes_and_dtypes(tiny_elmo, to_char_ids):
    out = tiny_elmo(to_char_ids(SENTENCES))
    assert set(out) == {
        "activations",
        "word_emb",
        "lstm_outputs1",
        "lstm_outputs2",
        "elmo",
        "default",
        "mask",
        "sequence_len",
    }
    assert len(out["activations"]) == L + 1 == tiny_elmo.num_output_layers
    for a in out["activations"]:
        assert a.shape == (3, 6, 2 * P) and a.dtype == tf.float32
    assert out["word_emb"].shape == (3, 6, P)
    assert out["elmo"].shape == (3, 6, 2 * P)
    assert out["default"].shape == (3, 2 * P)
    assert out["mask"].shape == (3, 6) and out["mask"].dtype == tf.bool
    assert out["sequence_len"].dtype == tf.int32
    two = ELMo(tiny_elmo.config, mixes=("ner", "pos"))(to_char_ids(SENTENCES))
    assert {"ner", "pos"} <= set(two) and "elmo" not in two


def test_outputs_are_the_stripped_layers(tiny_elmo, to_char_ids, randomize):
    """Compose the sublayers by hand: boundaries added around each sentence, removed from every output."""
    ids = to_char_ids(SENTENCES)
    out = arrays(tiny_elmo(ids))
    lengths = [len(s) for s in SENTENCES]
    for b, sentence in enumerate(SENTENCES):
        n = len(sentence)
        with_bounds = tokens_to_char_ids_numpy(["<S>"] + sentence + ["</S>"])[None]
        tokens = tiny_elmo.char_cnn(with_bounds)
        layers = tiny_elmo.bilm(tokens)
        np.testing.assert_allclose(out["word_emb"][b, :n], np.asarray(tokens)[0, 1 : n + 1], atol=1e-5, rtol=0)
        for layer in range(L):
            np.testing.assert_allclose(
                out["activations"][layer + 1][b, :n], np.asarray(layers[layer])[0, 1 : n + 1], atol=1e-5, rtol=0
            )
            np.testing.assert_array_equal(out[f"lstm_outputs{layer + 1}"][b], out["activations"][layer + 1][b])
    # layer 0 is the token layer duplicated
    np.testing.assert_array_equal(out["activations"][0], np.concatenate([out["word_emb"]] * 2, axis=-1))
    # the mix and the default (mean of the first mix over real tokens)
    mix = tiny_elmo.scalar_mixes[0]
    w = np.exp(mix.scalar_weights.numpy()) / np.exp(mix.scalar_weights.numpy()).sum()
    expected = float(mix.gamma.numpy()) * sum(wk * a for wk, a in zip(w, out["activations"]))
    np.testing.assert_allclose(out["elmo"], expected, atol=1e-5, rtol=0)
    for b, n in enumerate(lengths):
        np.testing.assert_allclose(out["default"][b], out["elmo"][b, :n].mean(axis=0), atol=1e-5, rtol=0)
    assert out["mask"].tolist() == [[t < n for t in range(6)] for n in lengths]
    assert out["sequence_len"].tolist() == lengths


@pytest.mark.parametrize("mix_layer_norm", [False, True], ids=["mix", "mix-layer-norm"])
def test_padding_invariance_across_batches(mix_layer_norm, make_elmo, to_char_ids):
    tiny_elmo = make_elmo(mix_layer_norm=mix_layer_norm)
    sentence = SENTENCES[0]
    alone = arrays(tiny_elmo(to_char_ids([sentence])))
    others = [["x"] * 15, ["a", "much", "longer", "sentence", "with", "many", "tokens", "in", "it"], ["y"] * 11]
    batched = arrays(tiny_elmo(to_char_ids(others[:2] + [sentence] + others[2:], num_tokens=20)))
    n = len(sentence)
    for layer in range(L + 1):
        np.testing.assert_allclose(
            batched["activations"][layer][2, :n], alone["activations"][layer][0], atol=1e-5, rtol=0
        )
        assert not batched["activations"][layer][2, n:].any()
    for key in ("word_emb", "elmo"):
        np.testing.assert_allclose(batched[key][2, :n], alone[key][0], atol=1e-5, rtol=0)
    np.testing.assert_allclose(batched["default"][2], alone["default"][0], atol=1e-5, rtol=0)
    assert batched["sequence_len"].tolist() == [15, 9, n, 11]


def test_empty_sentence_in_a_batch(tiny_elmo, to_char_ids):
    out = arrays(tiny_elmo(to_char_ids([SENTENCES[1], [], SENTENCES[0]])))
    assert out["sequence_len"].tolist() == [1, 0, 4]
    assert not out["mask"][1].any()
    for key in ("word_emb", "elmo", "default", "lstm_outputs1", "lstm_outputs2"):
        assert not out[key][1].any(), key
    alone = arrays(tiny_elmo(to_char_ids([SENTENCES[0]])))
    np.testing.assert_allclose(out["elmo"][2], alone["elmo"][0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("shape", [(0, 3), (0, 0)], ids=["no-sentences", "no-sentences-no-tokens"])
def test_empty_batch(tiny_elmo, shape):
    out = tiny_elmo(np.zeros(shape + (50,), np.int32))
    assert out["elmo"].shape == shape + (2 * P,)
    assert out["default"].shape == (0, 2 * P)
    assert out["sequence_len"].shape == (0,)
    assert [a.shape for a in out["activations"]] == [shape + (2 * P,)] * (L + 1)


def test_sentences_without_tokens(tiny_elmo):
    out = arrays(tiny_elmo(np.zeros((2, 0, 50), np.int32)))
    assert out["elmo"].shape == (2, 0, 2 * P)
    assert out["sequence_len"].tolist() == [0, 0]
    np.testing.assert_array_equal(out["default"], np.zeros((2, 2 * P)))


def test_embed_tokens_equals_char_id_input(tiny_elmo, to_char_ids):
    padded = [s + [""] * (6 - len(s)) for s in SENTENCES]
    from_strings = arrays(tiny_elmo.embed_tokens(tf.constant(padded)))
    from_ids = arrays(tiny_elmo(to_char_ids(SENTENCES)))
    np.testing.assert_array_equal(from_strings["elmo"], from_ids["elmo"])


def test_return_state_and_initial_state(tiny_elmo, to_char_ids):
    ids = to_char_ids(SENTENCES)
    out = tiny_elmo(ids, return_state=True)
    states = out["final_state"]
    assert len(states) == 4 * L
    # a zero initial state is the default
    zeros = [tf.zeros_like(s) for s in states]
    np.testing.assert_allclose(
        np.asarray(tiny_elmo(ids, initial_state=zeros)["elmo"]), np.asarray(out["elmo"]), atol=1e-6, rtol=0
    )
    carried = tiny_elmo(ids, initial_state=states)
    assert np.abs(np.asarray(carried["elmo"]) - np.asarray(out["elmo"])).max() > 1e-4


def test_constructor_validation(tiny_config, to_char_ids):
    assert ELMo(tiny_config.to_options()).config == tiny_config
    with pytest.raises(ValueError, match="default"):
        ELMo(tiny_config, mixes=("default",))
    with pytest.raises(ValueError, match="lstm_outputs1"):
        ELMo(tiny_config, mixes=("lstm_outputs1",))
    with pytest.raises(TypeError, match="config"):
        ELMo("small")
    model = ELMo(tiny_config)
    with pytest.raises(TypeError, match="float32"):
        model(np.zeros((1, 2, 50), np.float32))
    with pytest.raises(ValueError, match="50"):
        model(np.zeros((1, 2, 49), np.int32))


def test_in_a_functional_model_builds_runs_and_trains(tiny_elmo, to_char_ids):
    inputs = keras.Input(shape=(None, 50), dtype="int32")
    elmo_out = tiny_elmo(inputs)["elmo"]
    tags = keras.layers.Dense(3, name="tags")(elmo_out)
    model = keras.Model(inputs, tags)
    ids = to_char_ids(SENTENCES)
    before = np.asarray(model(ids))
    assert before.shape == (3, 6, 3)
    model.compile(keras.optimizers.SGD(0.05), "mse")
    kernel_before = model.get_layer("tags").kernel.numpy().copy()
    mix_before = tiny_elmo.scalar_mixes[0].scalar_weights.numpy().copy()
    history = model.fit(ids, np.ones((3, 6, 3), np.float32), batch_size=3, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert np.abs(model.get_layer("tags").kernel.numpy() - kernel_before).max() > 0
    assert np.abs(tiny_elmo.scalar_mixes[0].scalar_weights.numpy() - mix_before).max() > 0
    assert np.abs(np.asarray(model(ids)) - before).max() > 0


def test_get_config_from_config_round_trip(make_elmo, to_char_ids):
    model = make_elmo(mixes=("a", "b"), mix_layer_norm=True, dropout=0.1)
    config = model.get_config()
    clone = ELMo.from_config(config)
    assert clone.get_config() == config
    assert clone.config == model.config and clone.mixes == ("a", "b") and clone.mix_layer_norm
    clone.set_weights(model.get_weights())
    ids = to_char_ids(SENTENCES)
    a, b = arrays(model(ids)), arrays(clone(ids))
    for key in ("a", "b", "default", "word_emb", "lstm_outputs2"):
        np.testing.assert_array_equal(a[key], b[key])


def test_keras_save_load_round_trip(tiny_elmo, to_char_ids, tmp_path):
    ids = to_char_ids(SENTENCES)
    path = tmp_path / "elmo.keras"
    keras.saving.save_model(tiny_elmo, path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, ELMo) and loaded.config == tiny_elmo.config
    a, b = arrays(tiny_elmo(ids)), arrays(loaded(ids))
    for key in ("elmo", "default", "word_emb", "lstm_outputs1", "lstm_outputs2"):
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    assert len(loaded.weights) == len(tiny_elmo.weights)
    for w1, w2 in zip(tiny_elmo.weights, loaded.weights):
        np.testing.assert_array_equal(w1.numpy(), w2.numpy(), err_msg=w1.path)


def test_frozen_parts_survive_save_load(tiny_elmo, tmp_path):
    tiny_elmo.char_cnn.trainable = tiny_elmo.bilm.trainable = False
    path = tmp_path / "frozen.keras"
    keras.saving.save_model(tiny_elmo, path)
    loaded = keras.saving.load_model(path)
    assert not loaded.char_cnn.trainable and not loaded.bilm.trainable
    assert [w.path for w in loaded.trainable_weights] == [w.path for w in tiny_elmo.trainable_weights]
    assert loaded.trainable_weights and all("mix" in w.path for w in loaded.trainable_weights)
    config = tiny_elmo.get_config()
    assert config["frozen"] == ["char_cnn", "bilm"]
    with pytest.raises(ValueError, match="frozen: unknown part 'lstm'"):
        ELMo.from_config(dict(config, frozen=["lstm"]))


def test_functional_model_with_elmo_save_load_round_trip(tiny_elmo, to_char_ids, tmp_path):
    inputs = keras.Input(shape=(None, 50), dtype="int32")
    model = keras.Model(inputs, keras.layers.Dense(3)(tiny_elmo(inputs)["elmo"]))
    ids = to_char_ids(SENTENCES)
    path = tmp_path / "tagger.keras"
    keras.saving.save_model(model, path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(np.asarray(loaded(ids)), np.asarray(model(ids)))


def _before_the_transposed_kernels(weights, names):
    """As the code before the transposed LSTM kernels wrote a .keras file: no layout mark, every ProjectedLSTM kernel
    in the weight files' orientation."""
    marked = [name for name in names if name.endswith("/kernel_layout")]
    assert len(marked) == 4  # 2 layers x 2 directions
    for name in marked:
        group = weights[name.rsplit("/", 1)[0]]
        del group["kernel_layout"]
        for key in list(group):
            if group[key].ndim == 2:
                value = group[key][...].T
                del group[key]
                group[key] = value


def test_keras_files_from_before_the_transposed_kernels_still_load(tiny_elmo, to_char_ids, tmp_path):
    path = tmp_path / "elmo.keras"
    keras.saving.save_model(tiny_elmo, path)
    old = tmp_path / "old.keras"
    rewrite_keras_weights(path, old, _before_the_transposed_kernels)
    ids = to_char_ids([["a", "bc", "def"], ["x"]])
    want = tiny_elmo(ids)["elmo"].numpy()
    np.testing.assert_allclose(keras.saving.load_model(old)(ids)["elmo"].numpy(), want, atol=1e-6, rtol=0)
    np.testing.assert_allclose(keras.saving.load_model(path)(ids)["elmo"].numpy(), want, atol=1e-6, rtol=0)


def _before_the_cells(weights, names):
    """As the code before `ProjectedLSTMCell` wrote a .keras file: BiLM's lists held `ProjectedLSTM` layers, so their
    groups were named after that class (`forward_lstms/projected_lstm_1`)."""
    cells = [name for name in names if name.rsplit("/", 1)[-1].startswith("projected_lstm_cell")]
    assert len(cells) == 4  # 2 layers x 2 directions
    for name in cells:
        head, last = name.rsplit("/", 1)
        weights.move(name, f"{head}/{last.replace('projected_lstm_cell', 'projected_lstm')}")


def test_keras_files_from_before_the_lstm_cells_still_load(tiny_elmo, to_char_ids, tmp_path):
    """An ELMo (say inside a saved NER tagger) written when BiLM held `ProjectedLSTM` layers loads with its weights."""
    path = tmp_path / "elmo.keras"
    keras.saving.save_model(tiny_elmo, path)
    old = tmp_path / "old.keras"
    rewrite_keras_weights(path, old, _before_the_cells)
    ids = to_char_ids([["a", "bc", "def"], ["x"]])
    loaded = keras.saving.load_model(old)
    np.testing.assert_array_equal(loaded(ids)["elmo"].numpy(), tiny_elmo(ids)["elmo"].numpy())
    for w1, w2 in zip(tiny_elmo.weights, loaded.weights):
        np.testing.assert_array_equal(w1.numpy(), w2.numpy(), err_msg=w1.path)


def test_call_encodes_each_distinct_token_once(tiny_elmo, to_char_ids, monkeypatch):
    """`ELMo.call` runs the char CNN through `CharCNN.encode_distinct`: `<S>`, `</S>` and a repeated word once per
    batch, with the outputs of the char CNN on every position (test_outputs_are_the_stripped_layers)."""
    rows, encode_tokens = [], CharCNN.encode_tokens

    def spy(self, char_ids):
        rows.append(int(char_ids.shape[0]))
        return encode_tokens(self, char_ids)

    monkeypatch.setattr(CharCNN, "encode_tokens", spy)
    sentences = [["the", "cat", "the"], ["the"], []]
    out = arrays(tiny_elmo(to_char_ids(sentences)))
    assert rows == [5]  # <S>, </S>, the, cat and the padding row; 10 real positions
    every = np.asarray(tiny_elmo.char_cnn(tokens_to_char_ids_numpy(["<S>", "the", "cat", "the", "</S>"])[None]))
    np.testing.assert_allclose(out["word_emb"][0], every[0, 1:4], atol=1e-6, rtol=0)
    np.testing.assert_allclose(out["word_emb"][1, 0], every[0, 1], atol=1e-6, rtol=0)
    assert not out["word_emb"][1, 1:].any() and not out["word_emb"][2].any()


def test_one_activation_layout_for_the_model_the_embedder_and_the_export(tiny_elmo, to_char_ids):
    """`elmo_activations` (the token layer duplicated, then each LSTM layer) is the layout of `ELMo`'s
    `activations`, of `Embedder(layers="all")` and of the export's outputs stacked (`activations_from_outputs`)."""
    rng = np.random.default_rng(0)
    word, first, second = (rng.normal(size=(2, 3, width)).astype(np.float32) for width in (4, 8, 8))
    layers = [np.asarray(x) for x in elmo_activations(word, [first, second])]
    assert len(layers) == 3
    np.testing.assert_array_equal(layers[0], np.concatenate([word, word], axis=-1))
    np.testing.assert_array_equal(layers[1], first)
    np.testing.assert_array_equal(layers[2], second)
    ids = to_char_ids(SENTENCES)
    model = arrays(tiny_elmo(ids))["activations"]
    exported = contract.activations_from_outputs(contract.elmo_outputs(tiny_elmo, ids))  # (batch, L+1, T, 2P)
    embedded = Embedder(tiny_elmo, "all").embed_batch(SENTENCES)  # per sentence (L+1, n, 2P)
    for b, sentence in enumerate(SENTENCES):
        n = len(sentence)
        for k in range(L + 1):
            np.testing.assert_array_equal(exported[b, k], model[k][b])
            np.testing.assert_allclose(embedded[b][k], model[k][b, :n], atol=1e-6, rtol=0)
