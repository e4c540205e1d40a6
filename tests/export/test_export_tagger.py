"""The NER tagger + frozen ELMo exported as one SavedModel: fresh-process load, tags and spans as in Keras."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from cli_testlib import assert_ends_with_one_error, run_limited

from elmo_tf import BiLMConfig, ELMo
from elmo_tf.io.conll import Sentence
from elmo_tf.ner import Encoder, InProcessFeatures, NERBatches, predict_tags
from elmo_tf.ner.export import FEATURIZE_SIGNATURE, export_tagger, spans_from_tags
from elmo_tf.ner.model import NERTagger
from elmo_tf.ner.tags import convert, spans

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "export", "export_tagger.py")

SENTENCES = [
    Sentence("EU rejects German call to boycott British lamb .".split(), "B-ORG O B-MISC O O O B-MISC O O".split(), 1),
    Sentence("Peter Blackburn".split(), "B-PER I-PER".split(), 2),
    Sentence("BRUSSELS 1996-08-22".split(), "B-LOC O".split(), 3),
    Sentence("The European Commission said on Thursday".split(), "O B-ORG I-ORG O O O".split(), 4),
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    keras.utils.set_random_seed(3)
    elmo = ELMo(
        BiLMConfig(
            char_embedding_dim=4, filters=((1, 8), (2, 8)), num_highway=1, lstm_dim=16, projection_dim=8, num_layers=2
        )
    )
    encoder = Encoder.fit(SENTENCES, "iob2", "bioes", min_word_count=1)
    features = InProcessFeatures(elmo)([s.tokens for s in SENTENCES])
    batches = NERBatches(SENTENCES, encoder, encoder.featurizer(), features, batch_size=4, shuffle=False)
    head = NERTagger(
        encoder.labels,
        "bioes",
        num_elmo_layers=3,
        word_vocab_size=len(encoder.words) + 2,
        word_dim=8,
        char_filters=((2, 8),),
        lstm_units=8,
        dropout=0.0,
    )
    head.build_for(16)
    head.compile(keras.optimizers.Adam(0.05))
    head.fit(batches, epochs=40, verbose=0)
    base = tmp_path_factory.mktemp("tagger") / "tagger"
    path = export_tagger(head, encoder, str(base), elmo=elmo)
    return head, encoder, elmo, batches, path


@pytest.fixture(scope="module")
def loaded(trained):
    """The tagger export reloaded once (in this process) for the tests that call its signatures."""
    return tf.saved_model.load(trained[-1])


@pytest.mark.slow
def test_export_matches_keras_tagger_in_fresh_process(trained):
    head, encoder, _, batches, path = trained
    expected = predict_tags(head, batches)  # IOB2 (the files' scheme)
    code = (
        "import json, sys\n"
        "sys.modules['elmo_tf'] = None  # any import of elmo_tf fails: the SavedModel must not need it\n"
        "import tensorflow as tf\n"
        "m = tf.saved_model.load(sys.argv[1])\n"
        "o = m.signatures['tag'](sentences=tf.constant(json.loads(sys.argv[2])))\n"
        "print(json.dumps({k: v.numpy().tolist() for k, v in o.items()}, default=lambda b: b.decode()))\n"
    )
    sentences = [" ".join(s.tokens) for s in SENTENCES]
    proc = subprocess.run(
        [sys.executable, "-c", code, path, json.dumps(sentences)], capture_output=True, text=True, timeout=300, cwd="/"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for i, sentence in enumerate(SENTENCES):
        n = len(sentence.tokens)
        assert out["sequence_len"][i] == n
        bioes = out["tags"][i][:n]
        assert encoder.decode_tags([encoder.label_ids[t] for t in bioes]) == expected[i]
        got_spans = [
            (out["span_type"][i][k], out["span_start"][i][k], out["span_end"][i][k]) for k in range(out["num_spans"][i])
        ]
        assert got_spans == spans(expected[i], "iob2")
    # the tagger learned its 4 sentences: the export is not only consistent but right
    assert expected == [s.tags for s in SENTENCES]


def test_empty_sentences_and_batches_in_the_savedmodel(trained, loaded):
    """The reloaded `tag` signature on empty sentences: ["", ""] and an empty batch (InvalidArgumentError before), a
    batch whose longest sentence has one token (so did it), and empty sentences among others: empty ones get
    sequence_len 0, no tags, no spans; the others exactly what they get alone and what the Keras tagger gives."""
    head, encoder, elmo, _, _ = trained
    tag = loaded.signatures["tag"]

    def run(batch):
        return {k: v.numpy() for k, v in tag(sentences=tf.constant(batch, tf.string)).items()}

    both_empty = run(["", "  "])
    assert both_empty["sequence_len"].tolist() == [0, 0] and both_empty["num_spans"].tolist() == [0, 0]
    assert both_empty["tags"].shape == both_empty["tokens"].shape == (2, 0)
    assert both_empty["span_start"].shape == both_empty["span_end"].shape == both_empty["span_type"].shape == (2, 0)
    for key, value in run([]).items():
        assert value.shape[0] == 0, key
    texts = ["Peter Blackburn", "EU rejects German call to boycott British lamb .", "BRUSSELS", "Peter"]
    mixed = ["", texts[0], "", "", texts[1], texts[2], "", texts[3], ""]
    together = run(mixed)
    assert together["sequence_len"].tolist() == [len(t.split()) for t in mixed]
    items = [Sentence(t.split(), ["O"] * len(t.split()), 0) for t in texts]
    batches = NERBatches(
        items, encoder, encoder.featurizer(), InProcessFeatures(elmo)([s.tokens for s in items]), with_tags=False
    )
    keras_tags = [convert(tags, "iob2", "bioes") for tags in predict_tags(head, batches)]
    row = 0
    for i, text in enumerate(mixed):
        n = len(text.split())
        if not text:
            assert together["num_spans"][i] == 0 and not together["tags"][i].any() and not together["tokens"][i].any()
            continue
        alone = run([text])
        assert together["tags"][i, :n].tolist() == alone["tags"][0].tolist() == [t.encode() for t in keras_tags[row]]
        for key in ("span_start", "span_end", "span_type"):
            k = int(together["num_spans"][i])
            assert k == alone["num_spans"][0] and together[key][i, :k].tolist() == alone[key][0, :k].tolist(), key
        row += 1
    assert run(["Peter"])["tags"][0].tolist() == [t.encode() for t in keras_tags[3]]  # one token, alone in its batch


def test_spans_from_tags_matches_python_spans():
    labels = ["O", "B-PER", "I-PER", "E-PER", "S-PER", "B-LOC", "I-LOC", "E-LOC", "S-LOC"]
    rng = np.random.default_rng(0)
    from elmo_tf.ner.tags import from_spans

    rows, lengths = [], []
    for _ in range(50):
        n = int(rng.integers(0, 9))
        picked, i = [], 0
        while i < n:
            if rng.random() < 0.4:
                end = min(n, i + int(rng.integers(1, 4)))
                picked.append((str(rng.choice(["PER", "LOC"])), i, end))
                i = end + int(rng.integers(0, 2))
            else:
                i += 1
        rows.append([labels.index(t) for t in from_spans(n, picked, "bioes")])
        lengths.append(n)
    width = max(lengths)
    ids = np.array([r + [0] * (width - len(r)) for r in rows], np.int32)
    mask = np.arange(width)[None] < np.array(lengths)[:, None]
    num, start, end, kind = [t.numpy() for t in spans_from_tags(tf.constant(ids), tf.constant(mask), labels)]
    for r, row in enumerate(rows):
        want = spans([labels[i] for i in row], "bioes")
        got = [(kind[r][k].decode(), int(start[r][k]), int(end[r][k])) for k in range(num[r])]
        assert got == want


def test_cli_refuses_to_overwrite_a_version(trained, tmp_path):
    head, encoder, elmo, _, path = trained
    with pytest.raises(FileExistsError):
        export_tagger(head, encoder, os.path.dirname(path), elmo=elmo, version=1)


def test_training_and_export_run_the_same_featurizer(trained, loaded):
    """The tagger export's `featurize` signature (the SavedModel, reloaded) gives exactly the inputs training fed the
    head (NERBatches), on the training sentences and on words that test lowercasing, unknown words, long tokens and
    Unicode spaces kept inside tokens."""
    _, encoder, _, _, _ = trained
    sentences = [s.tokens for s in SENTENCES] + [
        ["EU", "İSTANBUL", "Straße", "ÄÖÜ", "x" * 60],
        ["Peter\u00a0Blackburn", "unknown-word", "BRUSSELS"],
        [],
    ]
    items = [Sentence(tokens, ["O"] * len(tokens), 0) for tokens in sentences]
    batches = NERBatches(
        items, encoder, encoder.featurizer(), None, batch_size=len(items), shuffle=False, with_tags=False
    )
    rows, trained_inputs, _ = batches.batch(0)
    served = loaded.signatures[FEATURIZE_SIGNATURE](sentences=tf.constant([" ".join(t) for t in sentences]))
    order = np.argsort(rows)  # NERBatches groups by length
    width = trained_inputs["mask"].shape[1]
    assert served["tokens"].shape[1] == width
    for key in ("mask", "word_ids", "char_ids"):
        np.testing.assert_array_equal(served[key].numpy(), trained_inputs[key][order], err_msg=key)
    words = served["word_ids"].numpy()
    assert words[0, 0] == 2 + encoder.words.index("eu")  # lowercased, found
    assert words[len(SENTENCES) + 1, 1] == 1 and words[-1].sum() == 0  # unknown -> 1; padding -> 0


def test_cli_errors_are_one_line(trained, tmp_path, run_script):
    code, _, err = run_script(SCRIPT, ["--ner", tmp_path / "missing", "--output", tmp_path / "out"])
    assert code == 2 and "--ner: not a directory" in err and err.count("\n") == 1, err
    (tmp_path / "empty").mkdir()
    code, _, err = run_script(SCRIPT, ["--ner", tmp_path / "empty", "--output", tmp_path / "out"])
    assert code == 2 and "--ner: no model.keras" in err and err.count("\n") == 1, err
    (tmp_path / "file").write_text("x")
    for name in ("model.keras", "encoder.json"):  # present (the output is checked before they are read)
        (tmp_path / "empty" / name).write_text("")
    code, _, err = run_script(SCRIPT, ["--ner", tmp_path / "empty", "--output", tmp_path / "file"])
    assert code == 2 and "--output: exists and is not a directory" in err, err


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--version", "99999999999999999999"], "--version must be <= 9223372036854775807 (int64), got"),
        (["--version", "0"], "--version must be >= 1"),
        (["--max-tokens", str(2**31)], "--max-tokens must be <= 2147483647 (int32), got"),
    ],
)
def test_cli_number_flags_are_checked_before_anything_runs(tmp_path, run_script, extra, needle):
    (tmp_path / "ner").mkdir()
    code, _, err = run_script(SCRIPT, ["--ner", tmp_path / "ner", "--output", tmp_path / "out" / "tagger", *extra])
    assert code == 2 and needle in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert os.listdir(tmp_path) == ["ner"]


@pytest.fixture(scope="module")
def ner_dir(tmp_path_factory):
    """A tiny --no-elmo tagger as train_ner.py writes it (one epoch through the library)."""
    from elmo_tf.ner.training import NERConfig, load_data, train_tagger

    root = tmp_path_factory.mktemp("ner_dir")
    (root / "train.txt").write_text("EU B-ORG\nrejects O\n\nPeter B-PER\nBlackburn I-PER\n" * 3)
    data = load_data({"train": str(root / "train.txt"), "dev": str(root / "train.txt")})
    train_tagger(NERConfig(epochs=1, lstm_units=4, use_chars=False), data, str(root / "ner"))
    return root / "ner"


@pytest.mark.slow
def test_cli_on_a_full_disk_publishes_nothing_and_ends_with_one_line(ner_dir, tmp_path):
    """A SavedModel the disk refuses (a file-size limit: EFBIG, as a full disk gives ENOSPC): exit 1, one line naming
    the base and the error, no version, no temporary, no base left behind."""
    base = tmp_path / "models" / "tagger"
    result = run_limited([SCRIPT, "--ner", ner_dir, "--output", base], 20_000, timeout=300)
    assert_ends_with_one_error(result, 1, "--output", f"cannot write {str(base)!r}", "File too large")
    assert os.listdir(tmp_path) == []


def test_the_warmup_file_asks_every_signature_and_runs(trained, loaded):
    """assets.extra/tf_serving_warmup_requests (TF Serving's saved_model_warmup_util.cc), read with TF Serving's
    protos: one PredictRequest per signature, the 8 warmup sentences, each run by the reloaded tagger."""
    from tensorflow_serving.apis import prediction_log_pb2

    from elmo_tf.saved_model.warmup import WARMUP_SENTENCES

    path = trained[-1]
    names = []
    for record in tf.data.TFRecordDataset(os.path.join(path, "assets.extra", "tf_serving_warmup_requests")):
        log = prediction_log_pb2.PredictionLog.FromString(record.numpy())
        request = log.predict_log.request
        names.append(request.model_spec.signature_name)
        sentences = tf.make_ndarray(request.inputs["sentences"])
        assert sentences.tolist() == [s.encode() for s in WARMUP_SENTENCES]
        out = loaded.signatures[names[-1]](sentences=sentences)
        assert out["sequence_len"].numpy().tolist() == [21, 11, 27, 19, 29, 7, 37, 19]
    assert sorted(names) == sorted(loaded.signatures) == ["featurize", "serving_default", "tag"]
