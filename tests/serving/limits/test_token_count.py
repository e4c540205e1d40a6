"""elmo_tf/serving/limits/token_count.py: the request budget counts the tokens the signature's own tokenizer makes
(issue 27, second hostile review: a `--tokenizer unicode_script` export served `["a," * 1500]` with sequence_len 3,000
while the budget counted 1 whitespace token against the limit of 1,000), read from the SavedModel's ops, counted cheaply
before the model runs."""

import os
import time

import grpc
import numpy as np
import pytest
import tensorflow as tf
from serving_fake import budget_error, sentences_budget
from serving_testlib import ex

import elmo_tf.serving.limits.token_count as tokens_module
from elmo_tf.serving.limits.budget import Limits
from elmo_tf.serving.limits.token_count import (
    UnicodeScriptCounter,
    WhitespaceCounter,
    signature_op_types,
    token_counter,
)
from elmo_tf.serving.servable import load_servable, read_meta_graph

tensorflow_text = pytest.importorskip("tensorflow_text")

SENTENCES = [
    b"",
    b"a",
    b"a,",
    b"a," * 1500,
    b"aren't.",
    "caf\u00e9 \u0645\u0631\u062d\u0628\u0627 \u4f60\u597d!".encode(),
]


def tokenizer_counts(sentences):
    tokens = tensorflow_text.UnicodeScriptTokenizer().tokenize(tf.constant(sentences, tf.string))
    return tokens.row_lengths().numpy().tolist()


def test_unicode_script_counter_counts_as_the_tokenizer(monkeypatch):
    counter = UnicodeScriptCounter()
    counts, partial = counter.counts(SENTENCES)
    assert counts == tokenizer_counts(SENTENCES) and partial is None
    assert counts[3] == 3000  # "a," * 1500: 1 whitespace token
    # in small pieces and batches: cuts at whitespace change nothing
    monkeypatch.setattr(tokens_module, "CHUNK_BYTES", 8)
    spaced = [b"one two, three four. five six seven " * 5, b"x y"]
    assert counter.counts(spaced)[0] == tokenizer_counts(spaced)


def test_counting_stops_above_the_bound(monkeypatch):
    """A sentence above what the limits allow ends the count: pieces after it are not read."""
    monkeypatch.setattr(tokens_module, "CHUNK_BYTES", 64)
    counter = UnicodeScriptCounter()
    seen = []
    real = counter._count
    monkeypatch.setattr(counter, "_count", lambda pieces: seen.append(len(pieces)) or real(pieces))
    counts, partial = counter.counts([b"a b", b"a," * 1000, b"c d"], bound=100)
    assert counts[0] == 2 and counts[1] > 100 and len(counts) == 2 and partial == 1
    assert sum(seen) < 10  # 2000 bytes in 64-byte pieces would be 32 pieces


def test_budget_counts_the_signatures_tokens():
    """`["a," * 1500]` is 3,000 tokens for a unicode_script signature (RESOURCE_EXHAUSTED at the 1,000 limit), one
    for a whitespace one; 16 sentences of 1,200 tokens are 19,200 tokens of work against 16,384."""
    UnicodeScriptCounter().counts([b"warm up the op"])
    unicode_budget = sentences_budget()
    unicode_budget.counter = UnicodeScriptCounter()
    details = budget_error(lambda: unicode_budget.prepare({"sentences": np.array([b"a," * 1500], object)}))
    assert "has 3000 tokens" in details and "--max_tokens_per_sentence" in details, details
    assert sentences_budget().prepare({"sentences": np.array([b"a," * 1500], object)}).time_estimate == 1
    wide = sentences_budget(Limits(max_tokens_per_sentence=5000))
    wide.counter = UnicodeScriptCounter()
    details = budget_error(lambda: wide.prepare({"sentences": np.array([b"a," * 600] * 16, object)}))
    assert "16 rows x 1200 tokens" in details and "--max_request_tokens" in details, details
    request = unicode_budget.prepare({"sentences": np.array([b"a, b.", b"c"], object)})
    assert (request.time_estimate, request.tokens) == (4, 8)


class _Tokenizers(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def unicode(self, sentences):
        ragged = tensorflow_text.UnicodeScriptTokenizer().tokenize(sentences)
        return {"sequence_len": tf.cast(ragged.row_lengths(), tf.int32)}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def whitespace(self, sentences):
        return {"sequence_len": tf.cast(tf.strings.split(sentences).row_lengths(), tf.int32)}


def test_the_tokenizer_is_read_from_the_saved_model(tmp_path):
    """signature_op_types walks a signature's nodes and the functions they call: one signature reaches the
    UnicodeScriptTokenizeWithOffsets op, the other does not; load_servable gives each runner its counter."""
    module = _Tokenizers()
    path = str(tmp_path / "1")
    tf.saved_model.save(module, path, signatures={"unicode": module.unicode, "whitespace": module.whitespace})
    meta_graph = read_meta_graph(path)
    ops = {name: signature_op_types(meta_graph, meta_graph.signature_def[name]) for name in ("unicode", "whitespace")}
    assert "UnicodeScriptTokenizeWithOffsets" in ops["unicode"]
    assert "UnicodeScriptTokenizeWithOffsets" not in ops["whitespace"] and "StringSplitV2" in ops["whitespace"]
    assert isinstance(token_counter(ops["unicode"]), UnicodeScriptCounter)
    assert isinstance(token_counter(ops["whitespace"]), WhitespaceCounter)
    servable = load_servable("t", 1, path)
    assert isinstance(servable.runners["unicode"].budget.counter, UnicodeScriptCounter)
    assert isinstance(servable.runners["whitespace"].budget.counter, WhitespaceCounter)


@pytest.mark.slow
def test_a_unicode_script_export_is_budgeted_by_its_tokens(model, tmp_path):
    """The real export (`export_elmo(..., tokenizer="unicode_script")`): its `default` signature counts with the
    tokenizer, its `tokens` signature (no tokenizer) is budgeted by its width; the 3,000-token sentence is refused
    before the model runs, and a request of the limit's size is served."""
    path = ex.export_elmo(model, str(tmp_path / "elmo"), tokenizer="unicode_script", check=False)
    servable = load_servable("elmo", 1, path)
    assert isinstance(servable.runners["default"].budget.counter, UnicodeScriptCounter)
    assert isinstance(servable.runners["tokens"].budget.counter, WhitespaceCounter)
    budget = servable.runners["default"].budget
    start = time.perf_counter()
    with pytest.raises(Exception) as info:
        budget.prepare({"sentences": np.array([b"a," * 1500], object)})
    assert getattr(info.value, "code", None) == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value
    assert "has 3000 tokens" in info.value.details and time.perf_counter() - start < 1.0
    request = budget.prepare({"sentences": np.array([b"a," * 500], object)})
    outputs = servable.runners["default"].run(request.inputs)
    assert outputs["sequence_len"].tolist() == [request.time_estimate] == [1000]
    assert os.path.isdir(path)
