"""elmo_tf/pretraining/model_dir.py: a model directory's weights.hdf5 and softmax.hdf5 that point outside themselves
are refused in one line naming the dataset (`load_model_dir`, `load_initial_weights`), and a weight file whose shapes
are not those of the options is refused before the model is built."""

import h5py
import numpy as np
import pytest
from hdf5_refs_testlib import KINDS, SECRET, make_reference, message_names

import elmo_tf.pretraining.model_dir as model_dir_module
from elmo_tf.io import WeightFileError, save_bilm_weights
from elmo_tf.io.vocabulary import Vocabulary
from elmo_tf.models.bilm_pretrainer import BiLMPretrainer
from elmo_tf.pretraining.model_dir import load_initial_weights, load_model_dir

BIAS = "RNN_1/RNN/MultiRNNCell/Cell0/LSTMCell/B"  # (64,) in the tiny config
WORDS = ["<S>", "</S>", "<UNK>", "the", "cat"]


@pytest.fixture
def model_dir(tiny_config, tiny_elmo, tmp_path):
    directory = tmp_path / "model"
    directory.mkdir()
    tiny_config.to_json(directory / "options.json")
    save_bilm_weights(tiny_elmo, directory / "weights.hdf5")
    with h5py.File(directory / "softmax.hdf5", "w") as f:
        f["softmax/W"] = np.ones((len(WORDS), tiny_config.projection_dim), np.float32)
        f["softmax/b"] = np.zeros(len(WORDS), np.float32)
    (directory / "vocab.txt").write_text("\n".join(WORDS) + "\n", encoding="utf-8")
    return directory


def test_a_clean_model_dir_loads(model_dir):
    model, vocab = load_model_dir(model_dir)
    assert vocab.words == WORDS
    np.testing.assert_array_equal(model.softmax_kernel.numpy(), 1.0)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("file,name,shape", [("weights.hdf5", BIAS, (64,)), ("softmax.hdf5", "softmax/W", (5, 8))])
def test_a_file_pointing_outside_is_refused(model_dir, tiny_config, kind, file, name, shape):
    path = model_dir / file
    named = make_reference(kind, path, name, shape)
    with pytest.raises(WeightFileError) as info:
        load_model_dir(model_dir)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and "\n" not in message and message_names(message, kind, named), message
    model = BiLMPretrainer(tiny_config, len(WORDS), dropout=0.0)
    with pytest.raises(WeightFileError):
        load_initial_weights(model, Vocabulary(WORDS), model_dir / "options.json", model_dir / "weights.hdf5")
    assert not any(np.any(v.numpy() == SECRET) for v in model.weights)


def test_shapes_are_compared_before_the_model_is_built(model_dir, tiny_config, monkeypatch):
    import dataclasses

    dataclasses.replace(tiny_config, lstm_dim=4096).to_json(model_dir / "options.json")

    def built(*args, **kwargs):
        raise AssertionError("BiLMPretrainer was built for options its weight file cannot fill")

    monkeypatch.setattr(model_dir_module, "BiLMPretrainer", built)
    with pytest.raises(WeightFileError, match=r"LSTMCell/W_0' has shape \(16, 64\), expected \(16, 16384\)"):
        load_model_dir(model_dir)
