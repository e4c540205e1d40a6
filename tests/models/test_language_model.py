"""elmo_tf/models/language_model.py: the biLM with its softmax as a language model (per-token log-probabilities in
both directions, top-k words), its chunked full softmax, the files it loads, and `evaluate_perplexity` on it."""

import json
import math

import h5py
import numpy as np
import pytest
import tensorflow as tf
from tiny_models import TINY, randomize_weights

import elmo_tf.models.language_model as language_model_module
from elmo_tf.config import BiLMConfig
from elmo_tf.io import WeightFileError, save_bilm_weights
from elmo_tf.io import softmax as softmax_io
from elmo_tf.io.softmax import LMVocabularyError
from elmo_tf.io.vocabulary import Vocabulary
from elmo_tf.models import BiLMPretrainer, LanguageModel, load_language_model
from elmo_tf.models.bilm_pretrainer import lm_states
from elmo_tf.models.language_model import full_softmax
from elmo_tf.pretraining import evaluate_perplexity

WORDS = ["<S>", "</S>", "<UNK>"] + "the cat sat on a mat dog ran to big red house . , and it was".split()
V = len(WORDS)  # 20: chunks of 6 leave a last chunk of 2, below a top k of 3
SENTENCES = [["the", "cat", "sat", "on", "the", "mat", "."], ["a", "dog", "ran"], ["zebra", "sat"], []]


def make_lm(top_k=0, chunk_size=6, seed=0):
    lm = LanguageModel(BiLMConfig(**TINY), V, top_k=top_k, chunk_size=chunk_size)
    randomize_weights(lm, seed, scale=0.5)
    lm.use_vocabulary(WORDS)
    return lm


def padded(sentences):
    width = max(len(s) for s in sentences)
    return tf.constant([s + [""] * (width - len(s)) for s in sentences], tf.string)


def numpy_reference(lm, tokens):
    """log softmax over the whole vocabulary in NumPy from the model's top states: `{direction: (B, T + 1, V)}` in
    the pretrainer's alignment, with the targets and weights."""
    from elmo_tf.preprocessing.chars import tokens_to_char_ids

    out = lm_states(
        lm.char_cnn,
        lm.bilm,
        {"char_ids": tokens_to_char_ids(tokens), "token_ids": lm.token_ids(tokens)},
        lm.bos_id,
        lm.eos_id,
    )
    w, b = lm.softmax_kernel.numpy().astype(np.float64), lm.softmax_bias.numpy().astype(np.float64)
    result = {}
    for direction in ("forward", "backward"):
        logits = out[direction].numpy().astype(np.float64) @ w.T + b
        top = logits.max(axis=-1, keepdims=True)
        result[direction] = logits - top - np.log(np.exp(logits - top).sum(axis=-1, keepdims=True))
        result[f"targets_{direction}"] = out[f"targets_{direction}"].numpy()
    return result


def test_log_probs_are_the_full_softmax_and_sum_to_one():
    lm = make_lm(top_k=V)
    tokens = padded(SENTENCES)
    out = lm.score_tokens(tokens)
    ref = numpy_reference(lm, tokens)
    for row, sentence in enumerate(SENTENCES):
        n = len(sentence)
        # every word of the vocabulary at every position: the distribution sums to 1
        for direction in ("forward", "backward"):
            total = np.exp(out[f"{direction}_top_k_log_probs"].numpy()[row, : n + 1]).sum(axis=-1)
            np.testing.assert_allclose(total, 1.0, atol=1e-5)
            assert np.all(out[f"{direction}_log_probs"].numpy()[row, n + 1 :] == 0)
        forward = [ref["forward"][row, j, ref["targets_forward"][row, j]] for j in range(n + 1)]
        np.testing.assert_allclose(out["forward_log_probs"].numpy()[row, : n + 1], forward, atol=1e-5)
        # backward: word i at entry i - 1, <S> last
        backward = [ref["backward"][row, j, ref["targets_backward"][row, j]] for j in range(n + 1)]
        np.testing.assert_allclose(
            out["backward_log_probs"].numpy()[row, : n + 1], backward[1:] + backward[:1], atol=1e-5
        )
    assert out["sequence_len"].numpy().tolist() == [len(s) for s in SENTENCES]


def test_chunk_size_changes_nothing():
    tokens = padded(SENTENCES)
    one = make_lm(top_k=4, chunk_size=V).score_tokens(tokens)
    for chunk in (1, 3, 7):
        other = make_lm(top_k=4, chunk_size=chunk).score_tokens(tokens)
        for key in ("forward_log_probs", "backward_log_probs", "forward_top_k_log_probs", "backward_top_k_log_probs"):
            np.testing.assert_allclose(other[key].numpy(), one[key].numpy(), atol=1e-5, err_msg=f"{key} chunk {chunk}")
        for key in ("forward_top_k_words", "backward_top_k_words"):
            assert (other[key].numpy() == one[key].numpy()).all(), key


def test_forward_never_depends_on_later_words_nor_backward_on_earlier_ones():
    lm = make_lm()
    base = ["the", "cat", "sat", "on", "the", "mat"]
    changed_end = base[:3] + ["a", "red", "house", "."]  # same first 3 words
    changed_start = ["it", "was", "big"] + base[3:]  # same last 3 words
    out = lm.score_tokens(padded([base, changed_end, changed_start]))
    fwd, bwd = out["forward_log_probs"].numpy(), out["backward_log_probs"].numpy()
    # forward entry i - 1 = log p(w_i | <S> w_1..w_i-1): the first 3 words see the same left context
    np.testing.assert_allclose(fwd[1, :3], fwd[0, :3], atol=1e-6)
    assert not np.allclose(fwd[1, 3:7], fwd[0, 3:7])  # the test can fail
    # backward entry i - 1 = log p(w_i | w_i+1..w_n </S>): the last 3 words, and </S>'s context, are the same
    np.testing.assert_allclose(bwd[2, 3:6], bwd[0, 3:6], atol=1e-6)
    assert not np.allclose(bwd[2, :3], bwd[0, :3])


def test_a_sentence_scores_the_same_alone_and_batched_with_longer_ones():
    lm = make_lm(top_k=2)
    alone = lm.score_tokens(padded([["a", "dog", "ran"]]))
    batched = lm.score_tokens(padded(SENTENCES))
    for key in ("forward_log_probs", "backward_log_probs", "forward_top_k_log_probs"):
        np.testing.assert_allclose(batched[key].numpy()[1, :4], alone[key].numpy()[0, :4], atol=1e-6)


def test_the_true_word_scores_its_entry_in_the_top_k():
    lm = make_lm(top_k=V)
    tokens = padded(SENTENCES)
    out = {k: v.numpy() for k, v in lm.score_tokens(tokens).items()}
    for row, sentence in enumerate(SENTENCES):
        targets = {
            "forward": [w if w in WORDS else "<UNK>" for w in sentence] + ["</S>"],
            "backward": [w if w in WORDS else "<UNK>" for w in sentence] + ["<S>"],
        }
        for direction, words in targets.items():
            for j, word in enumerate(words):
                listed = out[f"{direction}_top_k_words"][row, j].tolist()
                entry = out[f"{direction}_top_k_log_probs"][row, j][listed.index(word.encode())]
                assert out[f"{direction}_log_probs"][row, j] == pytest.approx(entry, abs=1e-6)
        assert (out["forward_top_k_words"][row, len(sentence) + 1 :] == b"").all()
    # a top k of 3 is the head of the full list, in decreasing order
    top3 = {k: v.numpy() for k, v in make_lm(top_k=3).score_tokens(tokens).items()}
    np.testing.assert_allclose(top3["forward_top_k_log_probs"], out["forward_top_k_log_probs"][..., :3], atol=1e-6)
    assert np.all(np.diff(top3["forward_top_k_log_probs"][0, :8], axis=-1) <= 0)


def test_words_out_of_the_vocabulary_are_scored_as_unk():
    lm = make_lm()
    out = lm.score_tokens(padded([["the", "zebra", "sat"], ["the", "<UNK>", "sat"]]))["forward_log_probs"].numpy()
    assert out[0, 1] == pytest.approx(out[1, 1], abs=1e-6)  # log p(<UNK> | <S> the) both


def test_full_softmax_matches_numpy_on_random_numbers():
    rng = np.random.default_rng(0)
    states, kernel, bias = rng.normal(size=(9, 5)), rng.normal(size=(23, 5)), rng.normal(size=23)
    targets = rng.integers(0, 23, size=9)
    out = full_softmax(
        tf.constant(states, tf.float32), targets, tf.constant(kernel, tf.float32), tf.constant(bias, tf.float32), 4, 5
    )
    logits = states @ kernel.T + bias
    log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(out["log_probs"].numpy(), log_probs[np.arange(9), targets], atol=1e-5)
    order = np.argsort(-log_probs, axis=1, kind="stable")[:, :5]
    np.testing.assert_array_equal(out["top_k_ids"].numpy(), order)
    empty = full_softmax(tf.zeros([0, 5]), tf.zeros([0], tf.int32), tf.constant(kernel, tf.float32), bias, 4, 2)
    assert empty["log_probs"].shape == (0,) and empty["top_k_ids"].shape == (0, 2)


def test_config_round_trip():
    lm = make_lm(top_k=3, chunk_size=5)
    again = LanguageModel.from_config(lm.get_config())
    assert (again.vocab_size, again.top_k, again.chunk_size, again.unk_id) == (V, 3, 5, 2)
    assert len(again.weights) == len(lm.weights)


# ---------------------------------------------------------------------------------------------------- files


@pytest.fixture
def released_files(tmp_path):
    """A biLM's options + weights, and a softmax + vocabulary in the released layout: `</S>`, `<S>`, `<UNK>` first
    (the order of bilm-tf's vocab-2016-09-10.txt), softmax/W (V, P), softmax/b (V,)."""
    config = BiLMConfig(**TINY)
    lm = LanguageModel(config, V)
    randomize_weights(lm, 3)
    config.to_json(tmp_path / "options.json")
    save_bilm_weights(lm, tmp_path / "weights.hdf5")
    words = ["</S>", "<S>", "<UNK>"] + WORDS[3:]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    rng = np.random.default_rng(1)
    weights, bias = rng.normal(size=(V, TINY["projection_dim"])).astype(np.float32), rng.normal(size=V)
    with h5py.File(tmp_path / "softmax.hdf5", "w") as f:
        f["softmax/W"], f["softmax/b"] = weights, bias.astype(np.float32)
    files = [str(tmp_path / n) for n in ("options.json", "weights.hdf5", "softmax.hdf5", "vocab.txt")]
    return files, words, weights, bias


def test_a_released_layout_softmax_loads(released_files, monkeypatch):
    files, words, weights, bias = released_files
    monkeypatch.setattr(softmax_io, "_ROWS_PER_READ", 7)  # read in blocks: 7 + 7 + 6 rows
    lm = load_language_model(*files, top_k=2)
    np.testing.assert_array_equal(lm.softmax_kernel.numpy(), weights)
    np.testing.assert_allclose(lm.softmax_bias.numpy(), bias, rtol=1e-6)
    assert (lm.bos_id, lm.eos_id, lm.unk_id) == (1, 0, 2)
    out = lm.score_tokens(tf.constant([["the", "cat"]]))
    assert out["forward_top_k_words"].shape == (1, 3, 2)
    # the forward LM's last entry predicts </S> (row 0 here), the backward one's <S> (row 1)
    ref = numpy_reference(lm, tf.constant([["the", "cat"]]))
    assert ref["targets_forward"][0, 2] == 0 and ref["targets_backward"][0, 0] == 1


@pytest.mark.parametrize(
    "damage,needle",
    [
        ("rows", "softmax/W has 19 rows, the vocabulary of"),
        ("width", "softmax/W is 7 wide, the biLM's projection_dim is 8"),
        ("bias", "softmax/b has 19 rows, softmax/W 20"),
        ("missing", "has no dataset 'softmax/b'"),
    ],
)
def test_a_softmax_that_does_not_fit_names_its_file(released_files, damage, needle):
    files, *_ = released_files
    with h5py.File(files[2], "r+") as f:
        w, b = f["softmax/W"][...], f["softmax/b"][...]
        del f["softmax/W"], f["softmax/b"]
        f["softmax/W"] = {"rows": w[:-1], "width": w[:, :-1]}.get(damage, w)
        if damage != "missing":
            f["softmax/b"] = b[:-1] if damage in ("rows", "bias") else b
    with pytest.raises(WeightFileError) as e:
        load_language_model(*files)
    assert str(e.value).startswith(files[2]) and needle in str(e.value)


def test_a_vocabulary_without_a_special_word_names_its_file(released_files):
    files, words, *_ = released_files
    with open(files[3], "w") as f:
        f.write("\n".join(w for w in words if w != "<UNK>") + "\n")
    with pytest.raises(LMVocabularyError, match=f"^{files[3]}: has no <UNK>"):
        load_language_model(*files)


def test_options_bigger_than_the_weight_file_build_nothing(released_files, monkeypatch):
    files, *_ = released_files
    options = json.loads(open(files[0]).read())
    options["lstm"]["dim"] = 65536  # within the options' bounds, far beyond the file: 4 GiB of LSTM per direction
    with open(files[0], "w") as f:
        json.dump(options, f)

    def built(*args, **kwargs):
        raise AssertionError("layers were built for options the weight file cannot fill")

    monkeypatch.setattr(language_model_module, "build_bilm_layers", built)
    with pytest.raises(WeightFileError, match=r"has shape .*, expected .* from the options") as e:
        load_language_model(*files)
    assert str(e.value).startswith(files[1])


# ---------------------------------------------------------------------------------------------------- perplexity


def _perplexity_before(model, vocab, files, batch_size):
    """evaluate_perplexity as it was before the language model: `losses_sum(sampled=False)` per batch."""
    from elmo_tf.preprocessing.lm_dataset import lm_dataset, vocabulary_table

    ds = lm_dataset(files, vocabulary_table(vocab.words), batch_size, shuffle_buffer=0, repeat=False)
    fwd = bwd = count = 0.0
    for batch in ds:
        f, b, n = model.losses_sum(batch, training=False, sampled=False)
        fwd, bwd, count = fwd + float(f), bwd + float(b), count + float(n)
    return {"forward": math.exp(fwd / count), "backward": math.exp(bwd / count), "tokens": int(count)}


def test_evaluate_perplexity_numbers_are_unchanged(tmp_path):
    vocab = Vocabulary(WORDS)
    model = BiLMPretrainer(BiLMConfig(**TINY), V, dropout=0.0)
    randomize_weights(model, 5, scale=0.5)
    text = tmp_path / "test.txt"
    text.write_text("the cat sat on the mat .\n\na dog ran to the big red zebra house\nit was\n" * 3)
    before = _perplexity_before(model, vocab, [str(text)], batch_size=4)
    after = evaluate_perplexity(model, vocab, [str(text)], batch_size=4, chunk_size=7)
    assert after["tokens"] == before["tokens"] == 3 * (8 + 10 + 3)
    for key in ("forward", "backward"):
        assert after[key] == pytest.approx(before[key], rel=1e-5)
    assert 5 < after["forward"] < 500  # random weights: a perplexity, not 1 or inf


def test_keras_file_round_trip(tmp_path):
    """A `.keras` file keeps the weights and the config; the vocabulary is an asset, attached again after loading."""
    import elmo_tf

    lm = make_lm(top_k=2)
    lm.save(tmp_path / "lm.keras")
    again = elmo_tf.load_model(tmp_path / "lm.keras")
    assert isinstance(again, LanguageModel) and again.top_k == 2
    again.use_vocabulary(WORDS)
    tokens = padded(SENTENCES)
    for key, value in lm.score_tokens(tokens).items():
        np.testing.assert_array_equal(again.score_tokens(tokens)[key].numpy(), value.numpy(), err_msg=key)


# ------------------------------------------------------------------------------------------------- precision

# bfloat16 against float32 log-probabilities, the tiny model's random weights: max |diff| (nats). Measured on the
# AVX2 EPYC: 0.012 forward, 0.010 backward, on log-probabilities down to about -6.
LOG_PROB_BOUND = 0.05


def test_a_bfloat16_language_model_scores_within_bfloat16_error():
    """Char CNN, biLM and softmax computing in bfloat16: float32 log-probabilities within LOG_PROB_BOUND of float32's,
    the same top words almost everywhere; the precision asked for is in the config."""
    lm = make_lm(top_k=3)
    low = LanguageModel.from_config(dict(lm.get_config(), precision="bfloat16"))
    low.set_weights(lm.get_weights())
    low.use_vocabulary(WORDS)
    assert low.precision == low.char_cnn.precision == low.bilm.precision == "bfloat16"
    assert low.get_config()["precision"] == "bfloat16" and "precision" not in lm.get_config()
    tokens = padded(SENTENCES)
    want, got = lm.score_tokens(tokens), low.score_tokens(tokens)
    for direction in ("forward", "backward"):
        w, g = want[f"{direction}_log_probs"].numpy(), got[f"{direction}_log_probs"].numpy()
        assert g.dtype == np.float32
        assert 0 < np.abs(g - w).max() <= LOG_PROB_BOUND
        same = got[f"{direction}_top_k_ids"].numpy() == want[f"{direction}_top_k_ids"].numpy()
        assert same.mean() > 0.9


def test_a_language_model_sharing_an_elmo_computes_in_its_precision(released_files):
    from elmo_tf.models import load_elmo
    from elmo_tf.precision import PrecisionError

    files, *_ = released_files
    elmo = load_elmo(files[0], files[1], precision="bfloat16")
    lm = load_language_model(*files, elmo=elmo)
    assert lm.precision == "bfloat16" and lm.bilm is elmo.bilm and "precision" not in lm.get_config()
    alone = load_language_model(*files, precision="bfloat16")
    tokens = tf.constant([["the", "cat", "sat"]])
    np.testing.assert_array_equal(
        lm.score_tokens(tokens)["forward_log_probs"].numpy(), alone.score_tokens(tokens)["forward_log_probs"].numpy()
    )
    with pytest.raises(PrecisionError, match="precision 'float32' computes in float32, but the shared char CNN"):
        load_language_model(*files, elmo=elmo, precision="float32")
