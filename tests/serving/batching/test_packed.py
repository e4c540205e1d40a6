"""elmo_tf/serving/batching/packed.py: merged `default`/`tokens` requests run through the export's `packed` signature,
each request getting what its own signature gives it alone (keys, shapes, dtypes, values within 1e-5)."""

import os

import grpc
import numpy as np
import pytest
from serving_testlib import ATOL, ex

from elmo_tf.serving.batching.merge import run_batch
from elmo_tf.serving.batching.packed import SENTENCES_MODE, TOKENS_MODE, attach_packed, packing_mode, read_max_tokens
from elmo_tf.serving.serving_error import ServingError

SENTENCE_BATCHES = [
    ["a b c d e f g h i j k l", "x", "", "one two three", "the the the the"],
    ["a b", "the cat sat on the mat .", "w " * 70, "Zürich , naïve café !", "z"],
    ["", "   "],
    ["dogs bark", "in the fog , aren't they ?", b"bad \xff\xfe bytes " + b"x" * 60 + b" " + b"x" * 61],
]


def assert_same(alone, merged):
    """Same keys, shapes and dtypes; floats within ATOL, the rest equal."""
    assert not isinstance(alone, ServingError) and not isinstance(merged, ServingError), (alone, merged)
    assert sorted(merged) == sorted(alone)
    for key, want in alone.items():
        got = merged[key]
        assert got.shape == want.shape and got.dtype == want.dtype, (key, got.shape, want.shape, got.dtype)
        if want.dtype.kind == "f":
            np.testing.assert_allclose(got, want, atol=ATOL, rtol=0, err_msg=key)
        else:
            np.testing.assert_array_equal(got, want, err_msg=key)


class Recording:
    """Counts the calls of a runner's `run` (restored by `undo`)."""

    def __init__(self, runner):
        self.runner, self.calls = runner, []
        run = runner.run

        def recording(inputs):
            self.calls.append(sorted(inputs))
            return run(inputs)

        runner.run = recording

    def undo(self):
        del self.runner.run


def run_recorded(runner, requests, max_rows):
    """`run_batch` of `requests`; returns (results, calls of the packed runner, calls of `runner`)."""
    packed, own = Recording(runner.packed), Recording(runner)
    try:
        results = run_batch(runner, requests, max_rows)
    finally:
        packed.undo()
        own.undo()
    return results, packed.calls, own.calls


def sentence_requests(runner, batches):
    encoded = [[s if isinstance(s, bytes) else s.encode() for s in b] for b in batches]
    return [runner.budget.prepare({"sentences": np.array(b, object)}) for b in encoded]


def token_requests(runner, rows_and_lengths):
    requests = []
    for rows, lengths in rows_and_lengths:
        tokens = np.array([[t.encode() for t in row] for row in rows], object).reshape(len(rows), -1)
        requests.append(runner.budget.prepare({"tokens": tokens, "sequence_len": np.array(lengths, np.int32)}))
    return requests


TOKEN_BATCHES = [
    ([["a", "b", "junk", "junk"], ["c", "", "d", "junk"], ["x", "y", "z", "w"]], [2, 3, 0]),  # "" inside, junk past
    ([["the", "cat"]], [2]),
    ([["p", "q", "r", "s", "t", "u"], ["v", "w", "x", "y", "z", "z"]], [6, 1]),
]


def test_merged_default_requests_run_packed_and_equal_each_alone(loaded):
    """Four requests (empty and whitespace-only sentences, a 70-token one that takes a row alone, repeated and unicode
    tokens, invalid UTF-8, two tokens alike in their first 48 bytes): packed calls of one row each (no call of
    `default` itself), and each request's outputs equal what it gets alone through `default`, shapes and dtypes
    included."""
    runner = loaded.runner("default")
    assert runner.packed is loaded.runner("packed") and packing_mode(runner) == SENTENCES_MODE
    requests = sentence_requests(runner, SENTENCE_BATCHES)
    results, packed_calls, own_calls = run_recorded(runner, requests, max_rows=1)
    assert own_calls == [] and len(packed_calls) >= 2
    for request, result in zip(requests, results):
        assert_same(runner.run_one(request), result)
    assert results[2]["elmo"].shape[:2] == (2, 0)  # only empty sentences: width 0, as alone


def test_merged_tokens_requests_ignore_junk_past_sequence_len(loaded):
    """`tokens` requests of different widths with junk past `sequence_len`, an "" token inside it and a length-0 row:
    packed, each equal to its own call alone (width: its padded input's)."""
    runner = loaded.runner("tokens")
    assert packing_mode(runner) == TOKENS_MODE
    requests = token_requests(runner, TOKEN_BATCHES)
    results, packed_calls, own_calls = run_recorded(runner, requests, max_rows=32)
    assert own_calls == [] and len(packed_calls) == 1
    for request, result in zip(requests, results):
        assert_same(runner.run_one(request), result)
    assert results[0]["word_emb"].shape[1] == 4 and results[0]["sequence_len"].tolist() == [2, 3, 0]


def test_a_bad_sequence_len_is_answered_alone_and_the_others_still_right(loaded):
    """A `sequence_len` beyond the width is not packed: the merged path runs, the bad request gets the signature's
    INVALID_ARGUMENT and its batch-mates their own outputs."""
    runner = loaded.runner("tokens")
    good = token_requests(runner, TOKEN_BATCHES[:2])
    bad = runner.budget.prepare({"tokens": np.array([[b"a", b"b"]], object), "sequence_len": np.array([1], np.int32)})
    bad.inputs["sequence_len"] = np.array([5], np.int32)  # past the check of the budget: the graph's own check
    results, packed_calls, _ = run_recorded(runner, [good[0], bad, good[1]], max_rows=32)
    assert packed_calls == []
    assert isinstance(results[1], ServingError) and results[1].code == grpc.StatusCode.INVALID_ARGUMENT
    for request, result in zip(good, (results[0], results[2])):
        assert_same(runner.run_one(request), result)


def test_lm_and_other_signatures_are_not_packed(loaded):
    runner = loaded.runner("packed")
    assert packing_mode(runner) is None and runner.packed is None
    assert attach_packed({"default": loaded.runner("default")}) == []  # no `packed` runner: nothing set


def test_a_direct_request_to_packed_is_held_to_the_token_budget(loaded):
    """`packed` answers requests like any signature, its work counted as every position of `table_rows`: 20,000
    positions with a single distinct token are above the default 16,384 tokens of work."""
    budget = loaded.runner("packed").budget
    small = {
        "tokens": np.array([[b"a"]], object),
        "table_rows": np.array([[[1, 3, 2]]], np.int32),
        "starts": np.array([[[True, False, False]]]),
    }
    assert budget.prepare(small).batch == 1
    big = dict(small, table_rows=np.ones([1, 200, 100], np.int32), starts=np.ones([1, 200, 100], bool))
    with pytest.raises(ServingError, match="20000 packed positions") as info:
        budget.prepare(big)
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.mark.parametrize("alias", ["table_rows", "starts"])
def test_a_packed_shape_is_refused_before_its_tensor_is_built(loaded, alias):
    """Issue 38: a 113-byte TensorProto declaring `[1, 8192, 8192]` (no values: TensorFlow would fill 256 MiB) is
    refused from its declared shape, by the check the fronts run before `tf.make_ndarray`."""
    from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2

    dtype = types_pb2.DT_INT32 if alias == "table_rows" else types_pb2.DT_BOOL
    shape = tensor_shape_pb2.TensorShapeProto(dim=[{"size": 1}, {"size": 8192}, {"size": 8192}])
    proto = tensor_pb2.TensorProto(dtype=dtype, tensor_shape=shape)
    assert proto.ByteSize() < 120
    with pytest.raises(ServingError, match=f"67108864 packed positions \\({alias} \\[1,8192,8192\\]\\)") as info:
        loaded.runner("packed").budget.check_tensor_proto(alias, proto)
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.fixture(scope="module")
def max_tokens_servable(model, tmp_path_factory):
    from elmo_tf.serving.servable import load_servable

    base = str(tmp_path_factory.mktemp("packed") / "cut")
    return load_servable("cut", 1, os.path.join(ex.export_elmo(model, base, max_tokens=3)))


@pytest.mark.slow
def test_max_tokens_export_cuts_packed_sentences_as_alone(max_tokens_servable):
    """An export with `max_tokens` 3: packed `default` and `tokens` requests are cut as the signatures cut them."""
    for name, requests in (
        ("default", sentence_requests(max_tokens_servable.runner("default"), SENTENCE_BATCHES)),
        ("tokens", token_requests(max_tokens_servable.runner("tokens"), TOKEN_BATCHES)),
    ):
        runner = max_tokens_servable.runner(name)
        assert read_max_tokens(runner.packed) == 3
        results, packed_calls, own_calls = run_recorded(runner, requests, max_rows=4)
        assert packed_calls and own_calls == []
        for request, result in zip(requests, results):
            assert_same(runner.run_one(request), result)
            assert result["word_emb"].shape[1] <= 3


@pytest.mark.slow
def test_without_warm_up_max_tokens_is_read_at_the_first_packed_call(model, tmp_path):
    """A load with warm-up off (--enable_model_warmup=false) runs nothing, not even the small call that reads the
    export's `max_tokens`: the first packed call makes it, then packs as with warm-up (cut at 3, each as alone)."""
    from elmo_tf.serving.servable import load_servable

    servable = load_servable("cut", 1, ex.export_elmo(model, str(tmp_path / "cut"), max_tokens=3), warmup=False)
    runner = servable.runner("default")
    assert runner.packed is servable.runner("packed") and runner.packed.max_tokens is None
    requests = sentence_requests(runner, SENTENCE_BATCHES)
    results, packed_calls, own_calls = run_recorded(runner, requests, max_rows=4)
    assert runner.packed.max_tokens == 3 and packed_calls and own_calls == []
    for request, result in zip(requests, results):
        assert_same(runner.run_one(request), result)


@pytest.mark.slow
def test_unicode_script_export_packs_tokens_but_not_sentences(model, tmp_path):
    """A `unicode_script` export: its tokenizer runs only in the graph, so `default` keeps the merged path; `tokens`
    (tokenized by the client) is packed."""
    pytest.importorskip("tensorflow_text", reason="tensorflow-text is not installed")
    from elmo_tf.serving.servable import load_servable

    servable = load_servable("u", 1, ex.export_elmo(model, str(tmp_path / "u"), tokenizer="unicode_script"))
    assert servable.runner("default").packed is None
    runner = servable.runner("tokens")
    requests = token_requests(runner, TOKEN_BATCHES)
    results, packed_calls, _ = run_recorded(runner, requests, max_rows=32)
    assert packed_calls
    for request, result in zip(requests, results):
        assert_same(runner.run_one(request), result)
