"""elmo_tf/ner/tagging.py: which feature source tagging opens (the flags first, else what training recorded)."""

import pytest

from elmo_tf.ner.tagging import RecordedSourceError, source_arguments


def test_source_arguments_take_the_flags_first_then_the_record(tmp_path):
    options, weights = tmp_path / "options.json", tmp_path / "weights.hdf5"
    options.write_text("{}")
    weights.write_bytes(b"")
    in_process = {"kind": "in_process", "options": str(options), "weights": str(weights)}
    served = {"kind": "server", "address": "127.0.0.1:1", "model_name": "elmo2"}
    assert source_arguments("ner", in_process) == {"options": str(options), "weights": str(weights)}
    assert source_arguments("ner", served) == {
        "elmo_server": "127.0.0.1:1",
        "model_name": "elmo2",
        "max_request_tokens": None,
    }
    for recorded in (in_process, served, {}):
        assert source_arguments("ner", recorded, elmo="runs/small") == {"elmo": "runs/small"}
    assert source_arguments("ner", in_process, elmo_server="127.0.0.1:2", max_request_tokens=9) == {
        "elmo_server": "127.0.0.1:2",
        "model_name": "elmo",
        "max_request_tokens": 9,
    }
    assert source_arguments("ner", served, model_name="other")["model_name"] == "other"
    with pytest.raises(RecordedSourceError, match="does not say where training got them"):
        source_arguments("ner", {})
    weights.unlink()
    with pytest.raises(RecordedSourceError, match="the biLM recorded in config.json is gone") as caught:
        source_arguments("ner", in_process)
    assert caught.value.path == str(weights)
