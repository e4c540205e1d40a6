"""elmo_tf/ner (model.py, training.py, features.py): the head overfits 20 CoNLL-2003 sentences to span F1 100
(with ELMo features only, and with its own word features only); `.keras` save and load; decoded BIOES/IOB2
sequences are always valid; padding invariance; ScalarMix settings reach the model; features from the model
server (serving/serve.py over gRPC, serving/client.py) equal the in-process ones and give identical tags.
"""

import functools
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import forked
import keras
import numpy as np
import pytest

from elmo_tf.io.conll import Sentence, read_conll
from elmo_tf.models import load_elmo
from elmo_tf.ner import Encoder, InProcessFeatures, NERBatches, NERConfig, NERData, predict_tags, span_scores
from elmo_tf.ner.model import NERTagger
from elmo_tf.ner.tagging import load_tagger, tag_sentences
from elmo_tf.ner.tags import allowed_transitions, from_spans, labels_for, spans
from elmo_tf.ner.training import fit_tagger, new_tagger

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = REPO_ROOT.parent / "shared" / "data"
CONLL_TRAIN = DATA_DIR / "conll2003" / "eng.train"
ALLENNLP = DATA_DIR / "elmo_fixtures" / "allennlp"

MAX_EPOCHS = 120  # the ELMo-only head reaches F1 100 after ~50 epochs of 2 batches, the word-only one after ~20


@functools.cache  # eng.train is parsed once for the tests that share these sentences
def twenty_sentences():
    if not CONLL_TRAIN.is_file():
        pytest.skip(f"{CONLL_TRAIN} not found (the shared data is not checked out)")
    return [s for s in read_conll(CONLL_TRAIN)[:200] if any(t != "O" for t in s.tags)][:20]


def fixture_elmo():
    if not (ALLENNLP / "lm_weights.hdf5").is_file():
        pytest.skip(f"{ALLENNLP} not found (the reference fixtures are not checked out)")
    return load_elmo(str(ALLENNLP / "options.json"), str(ALLENNLP / "lm_weights.hdf5"))


class StopAtPerfectF1(keras.callbacks.Callback):
    def __init__(self, batches):
        super().__init__()
        self.batches, self.f1, self.epochs = batches, [], 0

    def on_epoch_end(self, epoch, logs=None):
        self.epochs = epoch + 1
        if epoch % 5 == 4:
            gold = [s.tags for s in self.batches.sentences]
            self.f1.append(span_scores(gold, predict_tags(self.model, self.batches), "iob1")["f1"])
            if self.f1[-1] == 100.0:
                self.model.stop_training = True


def overfit(sentences, encoder, features, use_words, **tagger_kwargs):
    keras.utils.set_random_seed(7)
    use_elmo = features is not None
    model = NERTagger(
        encoder.labels,
        "bioes",
        num_elmo_layers=features[0].shape[0] if use_elmo else 0,
        word_vocab_size=len(encoder.words) + 2 if use_words else 0,
        word_dim=32,
        dropout=0.0,
        **tagger_kwargs,
    )
    model.build_for(features[0].shape[-1] if use_elmo else None)
    model.compile(optimizer=keras.optimizers.Adam(0.02))
    featurizer = encoder.featurizer(use_words=use_words, use_chars=False)
    train = NERBatches(sentences, encoder, featurizer, features, batch_size=10, seed=7)
    every = NERBatches(sentences, encoder, featurizer, features, batch_size=20, shuffle=False)
    stop = StopAtPerfectF1(every)
    model.fit(train, epochs=MAX_EPOCHS, callbacks=[stop], verbose=0)
    return model, every, stop


@pytest.fixture(scope="module")
def elmo_head():
    """A head trained on the fixture ELMo's features only (ELMo-only input: the biLM must carry the signal)."""
    sentences = twenty_sentences()
    elmo = fixture_elmo()
    encoder = Encoder.fit(sentences, "iob1", "bioes", min_word_count=1)
    features = InProcessFeatures(elmo)([s.tokens for s in sentences])
    model, batches, stop = overfit(sentences, encoder, features, use_words=False, lstm_units=64)
    return dict(
        model=model, encoder=encoder, sentences=sentences, features=features, batches=batches, stop=stop, elmo=elmo
    )


@pytest.mark.slow
def test_overfits_20_sentences_with_elmo_features(elmo_head):
    stop = elmo_head["stop"]
    assert stop.f1[-1] == 100.0, f"span F1 every 5 epochs: {stop.f1}"
    assert stop.f1[0] < 100.0  # it did have to learn
    predicted = predict_tags(elmo_head["model"], elmo_head["batches"])
    assert predicted == [s.tags for s in elmo_head["sentences"]]  # the IOB1 tags themselves, not only spans


@pytest.mark.slow
def test_overfits_20_sentences_without_elmo():
    sentences = twenty_sentences()
    encoder = Encoder.fit(sentences, "iob1", "bioes", min_word_count=1)
    model, batches, stop = overfit(sentences, encoder, None, use_words=True, lstm_units=32)
    assert stop.f1[-1] == 100.0, f"span F1 every 5 epochs: {stop.f1}"
    assert predict_tags(model, batches) == [s.tags for s in sentences]


def save_head(head, directory):
    os.makedirs(directory, exist_ok=True)
    head["model"].save(os.path.join(directory, "model.keras"))
    head["encoder"].save(os.path.join(directory, "encoder.json"))
    return directory


def potentials_and_tags(model, batches):
    out = []
    for index in range(len(batches)):
        _, inputs, _ = batches.batch(index)
        out.append((model.potentials(inputs).numpy(), model(inputs).numpy()))
    return out


FEATURE_SETS = [  # (id, NERTagger feature arguments, marks)
    ("elmo", dict(num_elmo_layers=3), ()),
    ("elmo+words", dict(num_elmo_layers=3, word_vocab_size=30), ()),
    ("elmo+words+chars", dict(num_elmo_layers=3, word_vocab_size=30, char_filters=((2, 8),)), ()),
    ("words+chars", dict(num_elmo_layers=0, word_vocab_size=30, char_filters=((2, 8),)), ()),  # --no-elmo
]


def random_tagger(seed=3, **features):
    keras.utils.set_random_seed(seed)
    model = NERTagger(["O", "B-PER", "I-PER", "E-PER", "S-PER"], "bioes", word_dim=8, lstm_units=8, **features)
    model.build_for(8 if model.num_elmo_layers else None)
    rng = np.random.default_rng(seed)
    for var in model.weights:
        var.assign(rng.normal(0, 0.5, size=tuple(var.shape)).astype("float32"))
    inputs = random_inputs(rng, [6, 3])
    inputs["char_ids"] = rng.integers(1, 200, size=inputs["mask"].shape + (50,)).astype(np.int32)
    return model, inputs


@pytest.mark.parametrize("features", [pytest.param(f, marks=m, id=i) for i, f, m in FEATURE_SETS])
def test_keras_load_model_restores_the_head(features, tmp_path):
    """`.keras` save then `keras.saving.load_model`: the same weights, potentials and tags."""
    model, inputs = random_tagger(**features)
    model.save(tmp_path / "model.keras")
    restored = keras.saving.load_model(tmp_path / "model.keras")
    assert len(restored.weights) == len(model.weights)
    np.testing.assert_allclose(restored.potentials(inputs).numpy(), model.potentials(inputs).numpy(), atol=1e-6)
    np.testing.assert_array_equal(restored(inputs).numpy(), model(inputs).numpy())


@pytest.mark.parametrize("features", [f for _, f, _ in FEATURE_SETS], ids=[i for i, _, _ in FEATURE_SETS])
def test_load_tagger_restores_the_head(features, tmp_path):
    """load_tagger gives the head back, with the activation width it was built for, for every feature
    set (with char features too: NERTagger.build_from_config)."""

    model, inputs = random_tagger(**features)
    model.save(tmp_path / "model.keras")
    Encoder(model.labels, "bioes", [], "iob2").save(tmp_path / "encoder.json")
    restored, encoder, dim = load_tagger(str(tmp_path))
    assert dim == (8 if model.num_elmo_layers else None) and encoder.labels == model.labels
    for w, v in zip(restored.weights, model.weights):
        np.testing.assert_array_equal(w.numpy(), v.numpy(), err_msg=w.path)
    np.testing.assert_allclose(restored.potentials(inputs).numpy(), model.potentials(inputs).numpy(), atol=1e-6)
    np.testing.assert_array_equal(restored(inputs).numpy(), model(inputs).numpy())


def test_trained_head_reloads_identically(elmo_head, tmp_path):
    """The overfit head after `.keras` save and load (load_tagger): same potentials, same tags."""

    save_head(elmo_head, tmp_path)
    restored, encoder, dim = load_tagger(str(tmp_path))
    assert dim == elmo_head["features"][0].shape[-1]
    assert encoder.to_json() == elmo_head["encoder"].to_json()
    assert restored.get_config() == elmo_head["model"].get_config()
    for (p1, t1), (p2, t2) in zip(
        potentials_and_tags(restored, elmo_head["batches"]),
        potentials_and_tags(elmo_head["model"], elmo_head["batches"]),
    ):
        np.testing.assert_allclose(p1, p2, atol=1e-6)
        np.testing.assert_array_equal(t1, t2)
    assert predict_tags(restored, elmo_head["batches"]) == [s.tags for s in elmo_head["sentences"]]


def random_inputs(rng, lengths, layers=3, dim=8, vocab=30):
    width = max(lengths)
    mask = np.arange(width)[None] < np.array(lengths)[:, None]
    acts = rng.normal(0, 1, size=(len(lengths), layers, width, dim)).astype("float32") * mask[:, None, :, None]
    words = rng.integers(1, vocab, size=mask.shape).astype(np.int32) * mask
    return {"mask": mask, "activations": acts, "word_ids": words}


@pytest.mark.parametrize("scheme", ["bioes", "iob2"])
def test_decoded_sequences_are_always_valid(scheme):
    """Random weights scaled up (potentials far from the transitions' scale) still decode to valid tags."""
    types = ("PER", "LOC", "ORG")
    labels = ["O"] + [f"{p}-{t}" for t in types for p in ("BIES" if scheme == "bioes" else "BI")]
    rng = np.random.default_rng(0)
    keras.utils.set_random_seed(0)
    model = NERTagger(labels, scheme, num_elmo_layers=3, word_vocab_size=30, word_dim=8, lstm_units=8, dropout=0.0)
    model.build_for(8)
    model.projection.kernel.assign(model.projection.kernel.numpy() * 30.0)
    trans, start, end = allowed_transitions(labels, scheme)
    lengths = list(rng.integers(0, 12, size=64))
    lengths[0] = 12
    inputs = random_inputs(rng, lengths)
    tags = model(inputs).numpy()
    noise = rng.normal(0, 50, size=tags.shape + (len(labels),)).astype("float32")
    raw = model.crf.decode(noise, inputs["mask"])[0].numpy()  # pure noise potentials
    for decoded in (tags, raw):
        for row, n in zip(decoded, lengths):
            ids = row[:n].tolist()
            sequence = [labels[i] for i in ids]
            assert from_spans(n, spans(sequence, scheme), scheme) == sequence, sequence
            assert not ids or (start[ids[0]] and end[ids[-1]] and all(trans[a, b] for a, b in zip(ids, ids[1:])))
            assert (row[n:] == 0).all()
    assert len({tuple(r) for r in tags}) > 10  # not a degenerate all-O model


def test_padding_and_batch_mates_do_not_change_a_sentence():
    rng = np.random.default_rng(1)
    keras.utils.set_random_seed(1)
    model = NERTagger(
        ["O", "B-PER", "I-PER", "E-PER", "S-PER"],
        "bioes",
        num_elmo_layers=3,
        word_vocab_size=30,
        word_dim=8,
        lstm_units=8,
        mix_layer_norm=True,
    )
    model.build_for(8)
    batch = random_inputs(rng, [3, 9, 5])
    potentials, tags = model.potentials(batch).numpy(), model(batch).numpy()
    alone = {k: v[:1, :, :3] if k == "activations" else v[:1, :3] for k, v in batch.items()}
    np.testing.assert_allclose(model.potentials(alone).numpy()[0], potentials[0, :3], atol=1e-5)
    np.testing.assert_array_equal(model(alone).numpy()[0], tags[0, :3])


def test_scalar_mix_settings_reach_the_model():
    """gamma's initial value and trainability, and the mix L2 (added to the loss as l2 * sum(w^2))."""
    rng = np.random.default_rng(2)
    labels = ["O", "B-PER", "I-PER", "E-PER", "S-PER"]
    inputs = random_inputs(rng, [4, 2])
    gold = np.zeros(inputs["mask"].shape, np.int32)
    losses = {}
    for mix_l2 in (0.0, 0.1):
        keras.utils.set_random_seed(2)
        model = NERTagger(
            labels,
            "bioes",
            num_elmo_layers=3,
            lstm_units=8,
            dropout=0.0,
            gamma=0.3,
            gamma_trainable=False,
            mix_l2=mix_l2,
        )
        model.build_for(8)
        model.mix.scalar_weights.assign([0.5, -1.0, 2.0])
        losses[mix_l2] = float(model.negative_log_likelihood(inputs, gold))
        assert float(model.mix.gamma.numpy()) == pytest.approx(0.3)
        assert not any(v is model.mix.gamma for v in model.trainable_variables)
    np.testing.assert_allclose(losses[0.1] - losses[0.0], 0.1 * (0.25 + 1.0 + 4.0), rtol=1e-4)
    trainable = NERTagger(labels, "bioes", num_elmo_layers=3, lstm_units=8).build_for(8)
    assert any(v is trainable.mix.gamma for v in trainable.trainable_variables)


def test_config_round_trip_and_bad_arguments():
    model = NERTagger(
        ["O", "B-PER", "I-PER"],
        "iob2",
        num_elmo_layers=2,
        word_vocab_size=10,
        char_filters=((2, 4),),
        lstm_units=4,
        dropout=0.2,
        gamma=2.0,
        gamma_trainable=False,
        mix_l2=0.01,
    )
    clone = NERTagger.from_config(model.get_config())
    assert clone.get_config() == model.get_config()
    with pytest.raises(ValueError, match="scheme"):
        NERTagger(["O"], "bilou")
    with pytest.raises(ValueError, match="dropout"):
        NERTagger(["O"], dropout=1.0)
    with pytest.raises(ValueError, match="labels"):
        NERTagger(["O", "O"])
    with pytest.raises(ValueError, match="features"):
        NERTagger(["O"], num_elmo_layers=0)


# ------------------------------------------------------------------------------------------------ empty sentences

TEN_SENTENCES = [
    "Peter Blackburn visited Paris",
    "EU rejects German call to boycott British lamb .",
    "Anna",
    "New York",
    "the European Commission said on Thursday",
    "Li Wei joined Siemens in Berlin",
    "x",
    "BRUSSELS 1996-08-22",
    "Mary and Ahmed Khan met in Lima .",
    "Reuters",
]
FILLED_LINES = (2, 3, 11, 20, 21, 22, 35, 41, 48, 49)  # of 50: the other 40 lines are blank


def lines_with_blanks():
    """10 sentences among 40 blank lines (token lists): sorted by length, the first batches hold empty ones only."""
    lines = [[] for _ in range(50)]
    for position, text in zip(FILLED_LINES, TEN_SENTENCES):
        lines[position] = text.split()
    return lines


def random_head(seed=5, **features):
    """An NERTagger (PER and LOC in BIOES) with N(0, 1) weights, so that its tags vary, and its Encoder."""
    keras.utils.set_random_seed(seed)
    words = sorted({w.lower() for text in TEN_SENTENCES for w in text.split()})[:20]
    labels = labels_for({"PER", "LOC"}, "bioes")
    model = NERTagger(labels, "bioes", word_vocab_size=len(words) + 2, word_dim=8, lstm_units=8, **features)
    model.build_for(16 if model.num_elmo_layers else None)
    rng = np.random.default_rng(seed)
    for var in model.weights:
        var.assign(rng.normal(0, 1.0, size=tuple(var.shape)).astype("float32"))
    for var in model.crf.weights:  # tags that follow the tokens more than the transitions
        var.assign(var.numpy() * 0.1)
    return model, Encoder(labels, "bioes", words, "iob2")


@pytest.mark.parametrize("use_elmo", [True, False], ids=["elmo", "no-elmo"])
def test_empty_sentences_get_empty_tags_in_any_batch(use_elmo, make_elmo):
    """Tagging 10 sentences among 40 blank lines (batches of empty sentences only; ELMo features from the tiny biLM
    in this process): every line gets a result, in order; an empty line gets no tags, the others exactly the tags
    they get when tagged alone."""
    model, encoder = random_head(num_elmo_layers=3 if use_elmo else 0, char_filters=((2, 8),))
    source = InProcessFeatures(make_elmo(), batch_size=8) if use_elmo else None
    lines = lines_with_blanks()
    tags = tag_sentences(model, encoder, lines, source, batch_size=8)
    alone = tag_sentences(model, encoder, [line for line in lines if line], source, batch_size=8)
    assert [t for t, line in zip(tags, lines) if line] == alone
    assert [t for t, line in zip(tags, lines) if not line] == [[]] * 40
    assert [len(t) for t in alone] == [len(text.split()) for text in TEN_SENTENCES]
    assert len({tag for sentence in alone for tag in sentence}) >= 3  # varied tags: the comparison is not trivial
    assert tag_sentences(model, encoder, [], source) == []


def test_batches_without_rows_or_tokens():
    """A batch of empty sentences, a batch without rows: tags, potentials and a loss of 0 (Keras's LSTM fails on
    both); an empty sentence adds 0 to a batch's NLL; a training step on empty sentences changes no weight."""
    model, inputs = random_tagger(**dict(FEATURE_SETS[2][1]))  # ELMo, words and chars; sentences of 6 and 3 tokens
    num_tags = len(model.labels)

    def empty(batch, steps):
        return {
            "mask": np.zeros([batch, steps], bool),
            "activations": np.zeros([batch, 3, steps, 8], np.float32),
            "word_ids": np.zeros([batch, steps], np.int32),
            "char_ids": np.zeros([batch, steps, 50], np.int32),
        }

    for batch, steps in ((3, 0), (0, 0), (0, 4), (2, 1)):
        assert model(empty(batch, steps)).numpy().tolist() == [[0] * steps] * batch
        assert model.potentials(empty(batch, steps)).shape == (batch, steps, num_tags)
        assert float(model.negative_log_likelihood(empty(batch, steps), np.zeros([batch, steps], np.int32))) == 0.0
    tags = np.array([[1, 3, 0, 4, 0, 0], [4, 1, 3, 0, 0, 0]], np.int32)
    mixed = {k: np.concatenate([v, np.zeros_like(v[:2])]) for k, v in inputs.items()}  # 2 more, empty, sentences
    mixed_tags = np.concatenate([tags, np.zeros_like(tags)])
    np.testing.assert_allclose(
        4 * float(model.negative_log_likelihood(mixed, mixed_tags)),
        2 * float(model.negative_log_likelihood(inputs, tags)),
        rtol=1e-5,
    )
    np.testing.assert_array_equal(model(mixed).numpy()[:2], model(inputs).numpy())
    model.compile(optimizer=keras.optimizers.Adam(0.1, clipnorm=5.0))
    before = [w.numpy().copy() for w in model.weights]
    logs = model.train_step((empty(3, 0), np.zeros([3, 0], np.int32)))
    assert float(logs["loss"]) == 0.0
    for w, b in zip(model.weights, before):
        np.testing.assert_array_equal(w.numpy(), b, err_msg=w.path)


TRAIN_WITH_EMPTIES = [
    Sentence([], [], 1),
    Sentence([], [], 2),
    Sentence(["Anna"], ["B-PER"], 3),
    Sentence(["Paris"], ["B-LOC"], 4),
    Sentence("Peter Blackburn visited New York".split(), "B-PER I-PER O B-LOC I-LOC".split(), 5),
]


@pytest.mark.parametrize("first_width", [0, 1], ids=["empty-sentences-first", "one-width-first"])
@pytest.mark.slow
def test_fit_tagger_when_the_first_batches_share_a_width(first_width):
    """Keras's adapter for a PyDataset fixes the shape its first two batches agree on: two first batches of empty
    sentences (or of one-token ones) made the first batch of another width fail mid-epoch (TypeError). Training now
    runs every batch of every epoch."""
    encoder = Encoder.fit(TRAIN_WITH_EMPTIES, "iob2", "bioes", min_word_count=1)
    featurizer = encoder.featurizer(use_chars=False)
    for seed in range(1, 100):  # a seed whose shuffled order starts with two batches of `first_width` tokens
        batches = NERBatches(TRAIN_WITH_EMPTIES, encoder, featurizer, batch_size=1, seed=seed)
        if [batches[i][0]["mask"].shape[1] for i in range(2)] == [first_width] * 2:
            break
    config = NERConfig(use_chars=False, lstm_units=4, batch_size=1, epochs=2, patience=2, seed=seed)
    data = NERData("iob2", {"train": TRAIN_WITH_EMPTIES, "dev": TRAIN_WITH_EMPTIES[2:]}, encoder, {})
    data.features = {"train": None, "dev": None}
    seen = []
    counter = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: seen.append(float(logs["loss"])))
    history, _ = fit_tagger(new_tagger(config, data), data, config, callbacks=[counter])
    assert len(history.history["loss"]) == 2 and len(seen) == 2 * len(TRAIN_WITH_EMPTIES)
    assert np.isfinite(seen).all() and len(history.history["val_span_f1"]) == 2


# ------------------------------------------------------------------------------------------------ served features


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def elmo_server(elmo_head, tmp_path_factory):
    """The fixture ELMo exported (export_elmo) and served by serving/serve.py on 127.0.0.1: (address, client)."""
    from elmo_tf.saved_model.export import export_elmo
    from elmo_tf.serving.client import ElmoClient

    base = tmp_path_factory.mktemp("served") / "elmo"
    export_elmo(elmo_head["elmo"], str(base))
    port = free_port()
    log = open(base.parent / "server.log", "w")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    server = forked.Popen(
        [
            sys.executable,
            str(REPO_ROOT / "serving" / "serve.py"),
            "--embedded",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--model_name",
            "elmo",
            "--model_base_path",
            str(base),
        ],
        cwd=REPO_ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    client = ElmoClient(f"127.0.0.1:{port}", model_name="elmo", timeout=60.0)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                client.wait_for_model(timeout=5)
                break
            except Exception:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        f"the server did not come up:\n{(base.parent / 'server.log').read_text()}"
                    ) from None
        yield f"127.0.0.1:{port}", client
    finally:
        client.close()
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


@pytest.mark.slow
def test_served_and_in_process_features_give_identical_predictions(elmo_head, elmo_server):
    from elmo_tf.ner import ServedFeatures

    _, client = elmo_server
    served = ServedFeatures(client, batch_size=7)  # other batch boundaries than in-process: padding differs
    in_process = InProcessFeatures(elmo_head["elmo"], batch_size=32)
    sentences = [s.tokens for s in elmo_head["sentences"]]
    extra = [["Zürich", "naïve", "café", "!"], ["x" * 60], ["a"]]
    for a, b in zip(served(sentences + extra), in_process(sentences + extra)):
        assert a.shape == b.shape and a.dtype == np.float32
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert (served.num_layers, served.dim) == (in_process.num_layers, in_process.dim)
    features = served(sentences)
    batches = NERBatches(
        elmo_head["sentences"],
        elmo_head["encoder"],
        elmo_head["encoder"].featurizer(use_words=False, use_chars=False),
        features,
        batch_size=20,
        shuffle=False,
    )
    assert predict_tags(elmo_head["model"], batches) == predict_tags(elmo_head["model"], elmo_head["batches"])
    assert predict_tags(elmo_head["model"], batches) == [s.tags for s in elmo_head["sentences"]]


def test_tag_py_with_elmo_server_equals_in_process_tags(elmo_head, elmo_server, tmp_path):
    """training/tag.py --elmo-server on the saved head tags like the in-memory model with in-process features; 40
    blank lines first (a request of empty sentences only, batches of them) get empty results, one per line."""
    address, _ = elmo_server
    model_dir = save_head(elmo_head, tmp_path / "ner")
    sentences_text = "".join(" ".join(s.tokens) + "\n" for s in elmo_head["sentences"][:8]) + "Peter visited Zürich .\n"
    text = "\n" * 40 + sentences_text
    result = forked.run(
        [
            sys.executable,
            str(REPO_ROOT / "training" / "tag.py"),
            "--model",
            str(model_dir),
            "--elmo-server",
            address,
            "--format",
            "json",
        ],
        input=text,
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES=""),
    )
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rows) == 49 and rows[:40] == [{"tokens": [], "tags": [], "spans": []}] * 40
    rows = rows[40:]
    sentences = [Sentence(line.split(), ["O"] * len(line.split()), 0) for line in sentences_text.splitlines()]
    features = InProcessFeatures(elmo_head["elmo"])([s.tokens for s in sentences])
    expected = predict_tags(
        elmo_head["model"],
        NERBatches(
            sentences,
            elmo_head["encoder"],
            elmo_head["encoder"].featurizer(use_words=False, use_chars=False),
            features,
            shuffle=False,
            with_tags=False,
        ),
    )
    assert [r["tokens"] for r in rows] == [s.tokens for s in sentences]
    assert [r["tags"] for r in rows] == expected
    assert expected[:8] == [s.tags for s in elmo_head["sentences"][:8]]
