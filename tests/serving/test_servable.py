"""serving/servable.py without a model (a fake signature): request checks, merged calls split and trimmed per
request, a failing request never fails its batch-mates, response size estimates and the after-the-call check."""

import grpc
import numpy as np
import pytest
from serving_fake import fake_runner

from serving.servable import Limits, check_response_size
from serving.status import ServingError


def test_merged_call_splits_and_trims_per_request():
    runner = fake_runner()
    a = runner.prepare({"x": np.ones((2, 3), np.float32)})
    b = runner.prepare({"x": np.full((1, 5), 3, np.float32)})
    results = runner.run_batch([a, b])
    np.testing.assert_array_equal(results[0]["y"], np.full((2, 3), 2))  # own width 3, not the merged 5
    np.testing.assert_array_equal(results[0]["total"], [3, 3])
    np.testing.assert_array_equal(results[1]["y"], np.full((1, 5), 6))
    np.testing.assert_array_equal(results[1]["total"], [15])


def test_a_failing_request_does_not_fail_its_batch_mates():
    calls = []
    runner = fake_runner(calls=calls)
    good = runner.prepare({"x": np.ones((1, 2), np.float32)})
    bad = runner.prepare({"x": -np.ones((1, 2), np.float32)})
    results = runner.run_batch([good, bad, good])
    assert len(calls) == 4  # the merged call, then one by one
    np.testing.assert_array_equal(results[0]["y"], [[2, 2]])
    np.testing.assert_array_equal(results[2]["y"], [[2, 2]])
    assert isinstance(results[1], ServingError) and results[1].code == grpc.StatusCode.INVALID_ARGUMENT
    assert results[1].details == "x must be >= 0"  # the op trace is dropped


def test_prepare_checks_dtype_rank_names_and_limits():
    runner = fake_runner(limits=Limits(max_request_sentences=2, max_tokens_per_sentence=3))
    for inputs, code, match in [
        ({"x": np.ones((1, 2), np.float64)}, grpc.StatusCode.INVALID_ARGUMENT, "expected dtype DT_FLOAT"),
        ({"x": np.ones(2, np.float32)}, grpc.StatusCode.INVALID_ARGUMENT, "expected rank 2"),
        ({"z": np.ones((1, 2), np.float32)}, grpc.StatusCode.INVALID_ARGUMENT, "alias not found in signature: z"),
        ({"x": np.ones((3, 2), np.float32)}, grpc.StatusCode.RESOURCE_EXHAUSTED, "3 rows"),
        ({"x": np.ones((1, 4), np.float32)}, grpc.StatusCode.RESOURCE_EXHAUSTED, "4 tokens wide"),
    ]:
        with pytest.raises(ServingError, match=match) as info:
            runner.prepare(inputs)
        assert info.value.code == code
    with pytest.raises(ServingError, match="duplicate output tensor alias: y"):
        runner.prepare({"x": np.ones((1, 2), np.float32)}, ["y", "y"])


def test_response_estimate_uses_dims_learned_at_warm_up():
    """A SignatureDef may leave inner dims unknown ([-1, -1, -1]); the warm-up outputs tell them."""
    runner = fake_runner(y_shape=(-1, -1))
    assert runner.response_bytes(batch=2, time=5, aliases=("y", "total")) == (2 * 5 + 2) * 4
    runner.learn_inner_dims({"y": np.zeros((1, 1, 7), np.float32), "total": np.zeros((1,), np.float32)})
    assert runner.inner_dims == {"y": (7,), "total": ()}
    assert runner.response_bytes(batch=2, time=5, aliases=("y",)) == 2 * 5 * 7 * 4


def test_response_size_is_checked_after_the_call():
    check_response_size({"y": np.zeros(100, np.float32)}, limit=400)
    with pytest.raises(
        ServingError,
        match=r"the response is 0.4 KiB \(outputs y\), above the server's limit of "
        r"0.4 KiB",
    ) as info:
        check_response_size({"y": np.zeros(101, np.float32)}, limit=400)
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
