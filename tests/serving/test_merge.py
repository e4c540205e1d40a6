"""elmo_tf/serving/merge.py without a model (a fake signature): merged calls split and trimmed per request, and a
failing request never fails its batch-mates."""

import grpc
import numpy as np
from serving_fake import fake_runner

from elmo_tf.serving.merge import run_batch
from elmo_tf.serving.status import ServingError


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
