"""elmo_tf/serving/batching/merge.py without a model (a fake signature): merged calls split and trimmed per request, and
a failing request never fails its batch-mates."""

import grpc
import numpy as np
from serving_fake import fake_runner

from elmo_tf.serving.batching.merge import run_batch
from elmo_tf.serving.serving_error import ServingError


def test_merged_call_splits_and_trims_per_request():
    runner = fake_runner()
    a = runner.budget.prepare({"x": np.ones((2, 3), np.float32)})
    b = runner.budget.prepare({"x": np.full((1, 5), 3, np.float32)})
    results = run_batch(runner, [a, b])
    np.testing.assert_array_equal(results[0]["y"], np.full((2, 3), 2))  # own width 3, not the merged 5
    np.testing.assert_array_equal(results[0]["total"], [3, 3])
    np.testing.assert_array_equal(results[1]["y"], np.full((1, 5), 6))
    np.testing.assert_array_equal(results[1]["total"], [15])


def test_a_failing_request_does_not_fail_its_batch_mates():
    calls = []
    runner = fake_runner(calls=calls)
    good = runner.budget.prepare({"x": np.ones((1, 2), np.float32)})
    bad = runner.budget.prepare({"x": -np.ones((1, 2), np.float32)})
    results = run_batch(runner, [good, bad, good])
    assert len(calls) == 4  # the merged call, then one by one
    np.testing.assert_array_equal(results[0]["y"], [[2, 2]])
    np.testing.assert_array_equal(results[2]["y"], [[2, 2]])
    assert isinstance(results[1], ServingError) and results[1].code == grpc.StatusCode.INVALID_ARGUMENT
    assert results[1].details == "x must be >= 0"  # the op trace is dropped


def test_regrouped_sentences_give_each_request_what_it_gets_alone(loaded):
    """Three requests of 11 sentences in all, 4 per call sorted by tokens: each call holds sentences of similar
    lengths, and each request's outputs (shapes included: its own longest sentence) equal its outputs alone."""
    from serving_testlib import assert_parity

    from elmo_tf.serving.batching.merge import regroupable

    runner = loaded.runner("default")
    assert regroupable(runner.signature) and not regroupable(loaded.runner("tokens").signature)
    batches = [
        ["a b c d e f g h i j k l", "x", "", "one two three"],
        ["a b", "the cat sat on the mat .", "w " * 30, "p q r s", "z"],
        ["dogs bark", "in the fog , aren't they ?"],
    ]
    requests = [runner.budget.prepare({"sentences": np.array([s.encode() for s in b], object)}) for b in batches]
    calls = []
    run = runner.run

    def recording(inputs):
        calls.append([len(s.split()) for s in inputs["sentences"]])
        return run(inputs)

    runner.run = recording
    runner.packed, packed = None, runner.packed  # the regrouped path (the export's `packed` one: test_packed.py)
    try:
        results = run_batch(runner, requests, max_rows=4)
    finally:
        del runner.run
        runner.packed = packed
    assert calls == [[0, 1, 1, 2], [2, 3, 4, 7], [7, 12, 30]]  # sorted by tokens, 4 rows a call
    for request, result in zip(requests, results):
        alone = runner.run_one(request)
        assert_parity(alone, result)
