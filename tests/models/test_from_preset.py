"""`ELMo.from_preset` and `load_elmo(name)` (elmo_tf/models/elmo.py over elmo_tf.presets): a model named in a registry
and served from 127.0.0.1 is downloaded once and gives the same vectors as `load_elmo(options, weights)` on the
same files; a TF Hub tarball's learned mix becomes the "elmo" mix."""

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from presets_testlib import FileServer, allennlp_model, served_models

from elmo_tf.models.elmo import ELMo, load_elmo

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "elmo_fixtures" / "allennlp"
TOKENS = tf.constant([["The", "cat", "sat", "."], ["Hello", "world", "", ""]])


@pytest.fixture
def registry(tmp_path, monkeypatch):
    with served_models(tmp_path, monkeypatch, {"fixture": allennlp_model()}) as server:
        yield server


def test_a_name_gives_the_vectors_of_the_files_it_names(registry):
    by_files = load_elmo(str(FIXTURES / "options.json"), str(FIXTURES / "lm_weights.hdf5"))
    expected = by_files.embed_tokens(TOKENS)
    for model in (ELMo.from_preset("fixture"), load_elmo("fixture")):
        got = model.embed_tokens(TOKENS)
        for key in ("word_emb", "lstm_outputs1", "lstm_outputs2", "elmo"):
            np.testing.assert_array_equal(got[key].numpy(), expected[key].numpy())
    assert len(registry.requests) == 2  # options and weights, once: the second model came from the cache


def test_mixes_and_other_arguments_reach_the_model(registry):
    model = ELMo.from_preset("fixture", mixes=("ner", "srl"))
    assert model.mixes == ("ner", "srl")


def test_a_tf_hub_tarballs_mix_becomes_the_elmo_mix(tmp_path, monkeypatch):
    import convert_testlib

    if not (convert_testlib.FIXTURES / "lm_weights.hdf5").is_file():
        pytest.skip(f"bilm-tf fixtures not found at {convert_testlib.FIXTURES}")
    module = tmp_path / "module"
    convert_testlib.write_module(module, convert_testlib.read_hdf5(convert_testlib.FIXTURES / "lm_weights.hdf5"))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as t:
        t.add(module, arcname=".")
    monkeypatch.setenv("ELMO_TF_HOME", str(tmp_path / "cache"))
    with FileServer({"elmo/3": buffer.getvalue()}) as server:
        model = ELMo.from_preset(server.url("elmo/3") + "?tf-hub-format=compressed")
    weights = tf.nn.softmax(model.scalar_mixes[0].scalar_weights).numpy().ravel()
    expected = tf.nn.softmax(convert_testlib.MIX_WEIGHTS).numpy()
    np.testing.assert_allclose(weights, expected, rtol=1e-6)
    np.testing.assert_allclose(float(np.asarray(model.scalar_mixes[0].gamma)), convert_testlib.SCALING, rtol=1e-6)
