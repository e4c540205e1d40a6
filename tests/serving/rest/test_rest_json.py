"""elmo_tf/serving/rest/rest_json.py: the JSON writer stops at its limit, a predict whose JSON response would be ~2x the
response limit is refused 429 naming the limit and its flag, and malformed and deeply nested JSON (arrays and objects,
depth 65 to 100000, in every position) is a 400 (issue 12, items 1 and 4; a real server on 127.0.0.1, RSS growth
printed and bounded).
"""

import json
import time

import numpy as np
import pytest
from rest_testlib import (
    SMALL_LIMIT,
    MiB,
    assert_still_serving,
    post,
    report,
)
from serving_testlib import rss_mib

from elmo_tf.serving.rest.rest_json import outputs_to_json
from elmo_tf.serving.serving_error import ServingError


def test_json_writer_stops_at_the_limit():
    """outputs_to_json never builds more than the limit (plus one row): it fails as soon as it passes it."""
    outputs = {"elmo": np.random.default_rng(0).standard_normal((64, 100, 64)).astype(np.float32)}
    limit = 1 * MiB
    with pytest.raises(ServingError) as error:
        outputs_to_json(outputs, row_format=False, limit=limit)
    assert error.value.code.name == "RESOURCE_EXHAUSTED" and error.value.http_status == 429
    assert f"more than {limit} bytes" in error.value.details and "--max_message_bytes" in error.value.details
    parts = outputs_to_json({"elmo": outputs["elmo"][:2]}, row_format=True, limit=limit)
    decoded = json.loads(b"".join(parts))
    np.testing.assert_array_equal(np.asarray(decoded["predictions"], np.float32), outputs["elmo"][:2])


def test_json_response_over_the_limit_is_refused(strict):
    """Binary outputs under the 4 MiB limit, their JSON (~3x) 1.5x to 3x over it: 429 naming the limit and flag."""
    rows, tokens = 40, 100
    binary = rows * tokens * (32 + 64 + 64 + 64) * 4  # word_emb, lstm_outputs1/2, elmo (float32) per token
    assert SMALL_LIMIT * 0.5 < binary < SMALL_LIMIT  # what gRPC would send is within the limit
    before = rss_mib()
    start = time.monotonic()
    status, body = post(strict.rest_port, {"inputs": [" ".join(["word"] * tokens)] * rows})
    elapsed = time.monotonic() - start
    after = rss_mib()
    report("json response 4x over", before, after, f", answered {status} in {elapsed:.2f} s")
    assert status == 429, body
    assert f"{SMALL_LIMIT}" in body["error"] or "4.0 MiB" in body["error"], body
    assert "--max_message_bytes" in body["error"], body
    assert after - before < 100
    assert_still_serving(strict.rest_port)
    status, body = post(strict.rest_port, {"inputs": ["a b"] * rows, "output_filter": ["default"]})
    assert status == 200  # a small response of as many rows is fine


def nested(depth, kind="array", leaf='"a"'):
    if kind == "array":
        return "[" * depth + leaf + "]" * depth
    return '{"a":' * depth + leaf + "}" * depth


@pytest.mark.parametrize("depth", [65, 1000, 100000])
@pytest.mark.parametrize("kind", ["array", "object"])
def test_deeply_nested_json_is_400(strict, depth, kind):
    port = strict.rest_port
    value = nested(depth, kind)
    bodies = [
        value,  # the whole document
        '{"instances": ' + value + "}",
        '{"instances": [' + value + "]}",
        '{"inputs": ' + value + "}",
        '{"inputs": {"sentences": ' + value + "}}",
        '{"signature_name": "tokens", "inputs": {"tokens": ' + value + ', "sequence_len": [1]}}',
        '{"signature_name": "tokens", "instances": [{"tokens": ' + value + ', "sequence_len": 1}]}',
        '{"instances": ["a"], "output_filter": ' + value + "}",
        '{"signature_name": ' + value + ', "instances": ["a"]}',
        value[: len(value) // 2],  # truncated
    ]
    before = rss_mib()
    start = time.monotonic()
    for text in bodies:
        status, body = post(port, text.encode())
        assert status == 400, (text[:80], body)
        assert set(body) == {"error"}, body
    elapsed = time.monotonic() - start
    after = rss_mib()
    report(f"nested {kind} depth {depth}", before, after, f", {len(bodies)} bodies answered 400 in {elapsed:.2f} s")
    assert after - before < 50
    assert_still_serving(port)
