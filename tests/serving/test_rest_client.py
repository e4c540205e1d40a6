"""elmo_tf/serving/rest_client.py: ElmoRestClient against the embedded server over REST (parity with the Keras model,
output_filter, status, errors)."""

import grpc
import pytest
from serving_testlib import assert_parity, reference_sentences, reference_tokens
from test_client import SENTENCES, TOKENS

from elmo_tf.serving.rest_client import ElmoRestClient
from elmo_tf.serving.serving_error import ServingError


def test_rest_client_matches_keras(rest_url, model):
    client = ElmoRestClient(rest_url, "elmo")
    try:
        out = client.embed(SENTENCES + [b"bad \xff\xfe bytes"])
        assert_parity(reference_sentences(model, SENTENCES + [b"bad \xff\xfe bytes"]), out)
        out = client.embed_tokens(TOKENS, output_filter=["elmo", "mask"])
        assert_parity(reference_tokens(model, TOKENS), out, keys=["elmo", "mask"])
        assert client.model_status()[0]["state"] == "AVAILABLE"
        with pytest.raises(ServingError, match="Latest") as info:
            ElmoRestClient(rest_url, "nope").embed(["a"])
        assert info.value.code == grpc.StatusCode.NOT_FOUND and info.value.http_status == 404
    finally:
        client.close()
