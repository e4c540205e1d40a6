"""elmo_tf/ner/pipeline.py: the one NER pipeline (featurizer + feature source + head). The same sentences tagged by
the three users of it agree exactly: tagging in this process (`tag_sentences`), the exported SavedModel (reloaded)
and `elmo-tf tag` (a subprocess, `python -m elmo_tf tag`); batches, padding and the source's checks."""

import json
import os
import sys
from pathlib import Path

import forked
import keras
import numpy as np
import pytest
import tensorflow as tf
from ner_testlib import shared_converted_efml
from tiny_models import TINY

from elmo_tf import BiLMConfig, ELMo, save_elmo
from elmo_tf.ner import Encoder, NERPipeline
from elmo_tf.ner.export import export_tagger
from elmo_tf.ner.features import InProcessFeatures, open_feature_source
from elmo_tf.ner.model import NERTagger
from elmo_tf.ner.pipeline import SourceMismatchError, batch_inputs, length_groups
from elmo_tf.ner.tagging import tag_sentences
from elmo_tf.ner.tags import labels_for, spans

REPO_ROOT = Path(__file__).resolve().parents[2]

TEXTS = [
    "Peter Blackburn visited Paris",
    "EU rejects German call to boycott British lamb .",
    "",
    "Anna",
    "the European Commission said on Thursday in Brussels",
    "Li Wei joined Siemens in Berlin",
    "x",
    "BRUSSELS 1996-08-22 Zürich naïve",
    "Mary and Ahmed Khan met in Lima .",
    "New York",
    "Reuters unknownword",
]


@pytest.fixture(scope="module")
def tagger(tmp_path_factory):
    """A head on ELMo, words and chars with N(0, 1) weights (varied tags), saved as train_ner.py writes it, and the
    tiny biLM it takes, saved beside: (model dir, biLM dir, head, encoder)."""
    root = tmp_path_factory.mktemp("pipeline")
    keras.utils.set_random_seed(4)
    elmo = ELMo(BiLMConfig(**TINY))
    elmo.embed_tokens(np.array([["a"]], dtype=object))
    save_elmo(elmo, str(root / "elmo"))
    words = sorted({w.lower() for text in TEXTS for w in text.split()})[:16]
    labels = labels_for({"PER", "LOC", "ORG"}, "bioes")
    head = NERTagger(
        labels,
        "bioes",
        num_elmo_layers=elmo.num_output_layers,
        word_vocab_size=len(words) + 2,
        word_dim=8,
        char_filters=((2, 8),),
        lstm_units=8,
    )
    head.build_for(2 * TINY["projection_dim"])
    rng = np.random.default_rng(4)
    for var in head.weights:
        var.assign(rng.normal(0, 1.0, size=tuple(var.shape)).astype("float32") * (0.1 if "crf" in var.path else 1.0))
    encoder = Encoder(labels, "bioes", words, "iob2")
    model_dir = root / "ner"
    model_dir.mkdir()
    head.save(model_dir / "model.keras")
    encoder.save(model_dir / "encoder.json")
    return model_dir, root / "elmo", head, encoder


@pytest.mark.slow
def test_in_process_savedmodel_and_elmo_tf_tag_agree(tagger, tmp_path):
    """The same 11 lines (one blank) tagged three ways, each with other batches: in this process (4 sentences a batch),
    by the exported SavedModel reloaded (one batch of all) and by `elmo-tf tag --format json` (3 a batch): the same
    tags, and the SavedModel's spans are the CLI's."""
    assert_three_ways_agree(*tagger, tmp_path)


def assert_three_ways_agree(model_dir, elmo_dir, head, encoder, tmp_path):
    token_lists = [text.split() for text in TEXTS]
    source, _ = open_feature_source(elmo=str(elmo_dir))
    in_process = tag_sentences(head, encoder, token_lists, source, batch_size=4)
    assert len({tag for tags in in_process for tag in tags}) >= 4  # varied tags: the comparison is not trivial

    path = export_tagger(head, encoder, str(tmp_path / "tagger"), elmo=source.elmo)
    out = tf.saved_model.load(path).signatures["tag"](sentences=tf.constant(TEXTS))
    out = {key: value.numpy() for key, value in out.items()}
    exported, exported_spans = [], []
    for i, tokens in enumerate(token_lists):
        n = int(out["sequence_len"][i])
        assert n == len(tokens)
        crf_tags = [t.decode() for t in out["tags"][i, :n]]
        exported.append(encoder.decode_tags([encoder.label_ids[t] for t in crf_tags]))
        exported_spans.append(
            [
                (out["span_type"][i, k].decode(), int(out["span_start"][i, k]), int(out["span_end"][i, k]))
                for k in range(out["num_spans"][i])
            ]
        )

    result = forked.run(
        [sys.executable, "-m", "elmo_tf", "tag", "--model", model_dir, "--elmo", elmo_dir, "--format", "json"]
        + ["--batch-size", "3", "--quiet"],
        input="".join(text + "\n" for text in TEXTS),
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES=""),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [row["tokens"] for row in rows] == token_lists
    assert [row["tags"] for row in rows] == in_process == exported
    assert [[(s["type"], s["start"], s["end"]) for s in row["spans"]] for row in rows] == exported_spans
    assert exported_spans == [spans(tags, "iob2") for tags in in_process]


def random_head(elmo, seed=4):
    """A head on `elmo`, words and chars (its own char CNN: the featurizer's `char_ids`) with N(0, 1) weights, and
    its encoder."""
    words = sorted({w.lower() for text in TEXTS for w in text.split()})[:16]
    labels = labels_for({"PER", "LOC", "ORG"}, "bioes")
    head = NERTagger(
        labels,
        "bioes",
        num_elmo_layers=elmo.num_output_layers,
        word_vocab_size=len(words) + 2,
        word_dim=8,
        char_filters=((2, 8),),
        lstm_units=8,
    )
    head.build_for(2 * elmo.config.projection_dim)
    rng = np.random.default_rng(seed)
    for var in head.weights:
        var.assign(rng.normal(0, 1.0, size=tuple(var.shape)).astype("float32") * (0.1 if "crf" in var.path else 1.0))
    return head, Encoder(labels, "bioes", words, "iob2")


@pytest.mark.parametrize("variant", ["word", "noword"])
@pytest.mark.slow
def test_a_converted_elmoformanylangs_biLM_feeds_the_tagger_its_own_char_mapping(variant, tmp_path, tmp_path_factory):
    """A converted ELMoForManyLangs model (code points looked up in its char vocabulary; `word`: the word id column)
    under a tagger with its own char CNN: the activations the tagger's graph computes (`graph_inputs`, what the
    export runs) equal `elmo.embed_tokens`'s and the host side's (`InProcessFeatures`, the embedder: what train-ner and
    tag use) within 1e-6, and in-process tagging, the exported SavedModel and `elmo-tf tag` agree."""
    elmo_dir = shared_converted_efml(tmp_path_factory, variant)  # read only
    source, _ = open_feature_source(elmo=str(elmo_dir))
    elmo = source.elmo
    head, encoder = random_head(elmo)
    pipeline = NERPipeline(head, encoder, source)
    token_lists = [text.split() for text in TEXTS] + [["Мама", "мыла", "раму", "ж" * 60, "日本語"]]
    width = max(len(t) for t in token_lists)
    tokens = tf.constant([[w.encode() for w in t] + [b""] * (width - len(t)) for t in token_lists])
    lengths = tf.constant([len(t) for t in token_lists])
    inputs = pipeline.graph_inputs(tokens, lengths)
    assert inputs["char_ids"].shape[-1] == 50  # the tagger's own char CNN: bilm-tf's byte ids, whatever the biLM
    graph = inputs["activations"].numpy()  # (batch, L+1, T, 2P)
    embedded = np.stack([a.numpy() for a in elmo.embed_tokens(tokens)["activations"]], axis=1)
    host = source(token_lists)
    for row, n in enumerate(lengths.numpy()):
        np.testing.assert_allclose(graph[row, :, :n], embedded[row, :, :n], atol=1e-6, rtol=0)
        np.testing.assert_allclose(graph[row, :, :n], host[row], atol=1e-6, rtol=0)
        assert not graph[row, :, n:].any()
    model_dir = tmp_path / "ner"
    model_dir.mkdir()
    head.save(model_dir / "model.keras")
    encoder.save(model_dir / "encoder.json")
    assert_three_ways_agree(model_dir, elmo_dir, head, encoder, tmp_path)


def test_a_source_that_does_not_fit_the_head_is_refused(tagger, make_elmo):
    _, _, head, encoder = tagger
    wide = make_elmo(BiLMConfig(**dict(TINY, projection_dim=6)), randomize=False)
    mismatch = "3 layers of width 12, the model was trained on 3 layers of width 16"
    with pytest.raises(SourceMismatchError, match=mismatch):
        NERPipeline(head, encoder, InProcessFeatures(wide))
    base = NERTagger(encoder.labels, "bioes", num_elmo_layers=0, word_vocab_size=4, lstm_units=4)
    with pytest.raises(SourceMismatchError, match="without ELMo"):
        NERPipeline(base, encoder, InProcessFeatures(wide))
    with pytest.raises(ValueError, match="feature source"):  # an ELMo head and no source: a clear error
        NERPipeline(head, encoder).tag([["a"]])


def test_length_groups_and_padded_batch_inputs(tagger):
    """Batches of similar length, shortest first, ties in input order; activations zero past each sentence's end and
    the featurizer's mask."""
    _, _, head, encoder = tagger
    assert length_groups([3, 0, 5, 3, 1], 2) == [[1, 4], [0, 3], [2]]
    assert length_groups([], 4) == []
    rng = np.random.default_rng(0)
    token_lists = [["Peter", "Blackburn"], [], ["EU", "rejects", "German"]]
    activations = [rng.normal(size=(3, len(t), 16)).astype(np.float32) for t in token_lists]
    inputs = batch_inputs(encoder.featurizer_for(head), token_lists, activations)
    assert inputs["activations"].shape == (3, 3, 3, 16) and inputs["mask"].tolist() == [
        [True, True, False],
        [False, False, False],
        [True, True, True],
    ]
    for row, array in enumerate(activations):
        n = array.shape[1]
        np.testing.assert_array_equal(inputs["activations"][row, :, :n], array)
        assert not inputs["activations"][row, :, n:].any()
    assert set(inputs) == {"mask", "word_ids", "char_ids", "activations"}
