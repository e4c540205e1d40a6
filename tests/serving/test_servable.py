"""elmo_tf/serving/servable.py's warm-up: a version's warmup file (assets.extra/tf_serving_warmup_requests) is replayed
at load as TF Serving replays it (saved_model_warmup.cc: each PredictionLog's request run once), instead of the
server's own small request; signatures the file does not reach, and exports without the file, get that one. With
warm-up off (stock's --enable_model_warmup=false) nothing runs at load."""

import os

import numpy as np
import pytest
import tensorflow as tf

import elmo_tf.serving.servable as servable_module
from elmo_tf.saved_model.warmup import WARMUP_SENTENCES, iter_warmup_requests, warmup_path, write_warmup_requests
from elmo_tf.serving.servable import WARMUP_TOKEN, load_servable
from elmo_tf.serving.serving_error import ServingError


@pytest.fixture
def calls(monkeypatch):
    """Every `SignatureRunner.run` made while loading: (signature, inputs)."""
    made = []
    run = servable_module.SignatureRunner.run

    def recording(self, inputs):
        made.append((self.name, inputs))
        return run(self, inputs)

    monkeypatch.setattr(servable_module.SignatureRunner, "run", recording)
    return made


def file_requests(path):
    return [
        (log.predict_log.request.model_spec.signature_name, dict(log.predict_log.request.inputs))
        for log in iter_warmup_requests(path)
    ]


def test_the_warmup_file_is_replayed_instead_of_the_synthetic_request(fresh_base, calls):
    version = os.path.join(fresh_base, "1")
    expected = file_requests(warmup_path(version))
    assert [name for name, _ in expected] == ["default", "serving_default", "tokens", "packed"]
    servable = load_servable("elmo", 1, version)
    # then one small call of `packed` reads the export's max_tokens (elmo_tf.serving.batching.packed.attach_packed)
    assert [name for name, _ in calls] == [name for name, _ in expected] + ["packed"]
    for (_, inputs), (_, protos) in zip(calls, expected):
        assert sorted(inputs) == sorted(protos)
        for alias, proto in protos.items():
            np.testing.assert_array_equal(inputs[alias], tf.make_ndarray(proto))
    assert calls[0][1]["sentences"].tolist() == [s.encode() for s in WARMUP_SENTENCES]
    # what the replay taught the response size model is what the synthetic request teaches: the outputs' inner dims
    width = 2 * 32  # the serving tests' model: projection 32
    assert servable.runners["tokens"].sizes.inner_dims["elmo"] == (width,)
    out = servable.runners["default"].run({"sentences": np.array([b"a b c"], object)})
    assert out["elmo"].shape == (1, 3, width)


def test_signatures_the_file_leaves_out_and_exports_without_it_get_the_synthetic_request(fresh_base, calls):
    version = os.path.join(fresh_base, "1")
    tokens = np.array([[b"only", b"tokens", b""]], object)
    write_warmup_requests(version, [("tokens", {"tokens": tokens, "sequence_len": np.array([2], np.int32)})])
    load_servable("elmo", 1, version)
    assert [name for name, _ in calls] == ["tokens", "default", "packed", "serving_default", "packed"]
    np.testing.assert_array_equal(calls[0][1]["tokens"], tokens)
    assert [inputs["sentences"].tolist() for _, inputs in (calls[1], calls[3])] == [[WARMUP_TOKEN]] * 2
    assert calls[2][1]["table_rows"].tolist() == [[[1]]]  # the synthetic request of `packed`: ones are valid
    calls.clear()
    os.remove(warmup_path(version))
    load_servable("elmo", 1, version)
    assert [name for name, _ in calls] == ["default", "packed", "serving_default", "tokens", "packed"]
    assert calls[3][1]["tokens"].tolist() == [[WARMUP_TOKEN]]


def test_a_bad_request_in_the_file_fails_the_load(fresh_base):
    version = os.path.join(fresh_base, "1")
    write_warmup_requests(version, [("default", {"sentences": np.array([1, 2], np.int32)})])
    with pytest.raises(ServingError, match="input .sentences. of signature .default.: expected dtype DT_STRING") as e:
        load_servable("elmo", 1, version)
    assert e.value.code.name == "INVALID_ARGUMENT"


def test_a_warmup_request_above_the_server_limits_is_not_run(fresh_base, calls):
    """Hostile review (s12): the replay ran the file's requests without the request limits, so a 100-byte record
    (one string, declared shape [N]: TensorFlow fills it) made an N-row array and an N-sentence run at load, for any
    N: memory and time without bound, in the process that serves the current version. A request the server's limits
    refuse is not run (logged); its signature gets the synthetic request as if the file had left it out."""
    from tensorflow_serving.apis import prediction_log_pb2

    from elmo_tf.serving.limits.budget import Limits

    version = os.path.join(fresh_base, "1")
    log = prediction_log_pb2.PredictionLog()
    request = log.predict_log.request
    request.model_spec.signature_name = "default"
    proto = tf.make_tensor_proto([b"a"], dtype=tf.string)
    proto.tensor_shape.dim[0].size = 5000
    request.inputs["sentences"].CopyFrom(proto)
    path = warmup_path(version)
    with tf.io.TFRecordWriter(path) as writer:
        writer.write(log.SerializeToString())
    servable = load_servable("elmo", 1, version, Limits(max_request_sentences=256))
    assert [(name, len(inputs[next(iter(inputs))])) for name, inputs in calls] == [
        ("default", 1),
        ("packed", 1),
        ("serving_default", 1),
        ("tokens", 1),
        ("packed", 1),  # after the warm-up, the packed path's own check (elmo_tf.serving.batching.packed)
    ]
    assert servable.runners["default"].run({"sentences": np.array([b"a b"], object)})["elmo"].shape[:2] == (1, 2)


def test_a_warmup_file_with_requests_above_the_limits_and_others_still_loads(fresh_base):
    """The export's own warmup file under tight limits (100 tokens per sentence: its `packed` request, all the distinct
    tokens of its 8 sentences in one row, is wider): the refused request is skipped, the others replayed, and the
    version loads (it failed with a TypeError sorting the replayed names with None among them)."""
    from elmo_tf.serving.limits.budget import Limits

    servable = load_servable("elmo", 1, os.path.join(fresh_base, "1"), Limits(max_tokens_per_sentence=100))
    assert servable.runners["default"].run({"sentences": np.array([b"a b"], object)})["elmo"].shape[:2] == (1, 2)


def test_with_warmup_off_nothing_runs_at_load_and_a_failing_warmup_file_is_not_read(fresh_base, calls, model):
    """Stock runs RunSavedModelWarmup only when enable_model_warmup is on (Server::BuildAndStart in server.cc sets it
    from the flag; saved_model_bundle_source_adapter.cc GetServableCreator checks it): with it off, a version whose
    warmup file holds a request that fails loads, nothing runs at load, and the first call teaches the response size
    model the outputs' dims (before it, the estimate counts the SignatureDef's). On (the default) the same version fails
    to load."""
    from serving_testlib import assert_parity, reference_sentences

    version = os.path.join(fresh_base, "1")
    write_warmup_requests(version, [("nosuch", {"sentences": np.array([b"a b"], object)})])
    with pytest.raises(ServingError, match='Serving signature key "nosuch" not found.'):
        load_servable("elmo", 1, version)
    calls.clear()
    servable = load_servable("elmo", 1, version, warmup=False)
    assert calls == []
    runner = servable.runners["default"]
    assert runner.sizes.inner_dims == {}
    out = runner.run({"sentences": np.array([b"the first request"], object)})
    assert [name for name, _ in calls] == ["default"]
    assert_parity(reference_sentences(model, ["the first request"]), out)
    assert runner.sizes.inner_dims["elmo"] == (2 * 32,) and runner.sizes.inner_dims["default"] == (2 * 32,)
