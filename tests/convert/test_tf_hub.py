"""elmo_tf/convert/tf_hub.py: a TF1 Hub module dir (tfhub_module.pb + variables/, the variables written here by a TF1
Saver under the google/elmo module's names) converts to the weight file of the same weights (bilm-tf's fixture, bit
for bit), options derived from the shapes, and scalar_mix.json that makes our ScalarMix compute the module's mix."""

import json
import os

import numpy as np
import pytest
from convert_testlib import FIXTURES, MIX_WEIGHTS, SCALING, read_hdf5, write_module

from elmo_tf.convert import ConvertError, convert
from elmo_tf.convert.tf_hub import hdf5_name, load_scalar_mix


@pytest.fixture
def dumped():
    if not (FIXTURES / "lm_weights.hdf5").is_file():
        pytest.skip(f"bilm-tf fixtures not found at {FIXTURES}")
    return read_hdf5(FIXTURES / "lm_weights.hdf5")


def test_lstm_names_are_the_modules():
    assert (
        hdf5_name("bilm/RNN_1/RNN/MultiRNNCell/Cell0/rnn/lstm_cell/projection/kernel")
        == "RNN_1/RNN/MultiRNNCell/Cell0/LSTMCell/W_P_0"
    )
    assert (
        hdf5_name("bilm/RNN_0/RNN/MultiRNNCell/Cell1/rnn/lstm_cell/kernel")
        == "RNN_0/RNN/MultiRNNCell/Cell1/LSTMCell/W_0"
    )
    assert hdf5_name("bilm/CNN_proj/W_proj") == "CNN_proj/W_proj"
    for ignored in ("bilm/Variable", "aggregation/weights", "module/bilm/char_embed"):
        assert hdf5_name(ignored) is None


def test_converts_weights_options_and_the_mix(tmp_path, dumped):
    write_module(tmp_path / "elmo_3", dumped)
    written = convert("tf-hub", str(tmp_path / "elmo_3"), str(tmp_path / "out"))
    assert sorted(os.path.basename(p) for p in written) == ["options.json", "scalar_mix.json", "weights.hdf5"]
    got = read_hdf5(tmp_path / "out" / "weights.hdf5")
    assert sorted(got) == sorted(dumped)
    for name, array in dumped.items():
        assert got[name].tobytes() == array.astype(np.float32).tobytes(), name
    options = json.loads((tmp_path / "out" / "options.json").read_text())
    reference = json.loads((FIXTURES / "options.json").read_text())
    for key in ("dim", "projection_dim", "n_layers"):
        assert options["lstm"][key] == reference["lstm"][key], key
    assert options["char_cnn"] == reference["char_cnn"]  # shapes, and relu / 50 chars / 262 from the release
    assert options["lstm"]["use_skip_connections"] is True and options["lstm"]["cell_clip"] == 3  # the release's
    mix = json.loads((tmp_path / "out" / "scalar_mix.json").read_text())
    assert mix == {"num_layers": 3, "initial_weights": MIX_WEIGHTS.tolist(), "initial_gamma": float(SCALING)}


def test_scalar_mix_json_gives_the_modules_mix(tmp_path, dumped):
    from elmo_tf.layers import ScalarMix

    write_module(tmp_path / "m", dumped)
    convert("tf-hub", str(tmp_path / "m"), str(tmp_path / "out"))
    path = tmp_path / "out" / "scalar_mix.json"
    layers = [np.random.default_rng(k).standard_normal((2, 3, 4)).astype(np.float32) for k in range(3)]
    w = np.exp(MIX_WEIGHTS) / np.exp(MIX_WEIGHTS).sum()
    expected = SCALING * sum(wk * h for wk, h in zip(w, layers))  # the module: scaling * sum softmax(weights)_k h_k
    mix = ScalarMix(**json.loads(path.read_text()))
    np.testing.assert_allclose(mix(layers).numpy(), expected, rtol=1e-6, atol=1e-6)
    other = ScalarMix(3)
    other.build([(None, None, 4)] * 3)
    load_scalar_mix(other, str(path))
    np.testing.assert_array_equal(other.scalar_weights.numpy(), MIX_WEIGHTS)
    assert other.gamma.numpy() == SCALING


def test_options_flag_is_checked_against_the_shapes(tmp_path, dumped):
    write_module(tmp_path / "m", dumped)
    options = json.loads((FIXTURES / "options.json").read_text())
    (tmp_path / "options.json").write_text(json.dumps(options))
    convert("tf-hub", str(tmp_path / "m"), str(tmp_path / "out"), options=str(tmp_path / "options.json"))
    assert json.loads((tmp_path / "out" / "options.json").read_text()) == options  # skip connections off, as given
    options["char_cnn"]["n_highway"] = 1
    (tmp_path / "options.json").write_text(json.dumps(options))
    with pytest.raises(ConvertError, match=r"variables\.index: holds 'CNN_high_1/W_carry', which .*options\.json"):
        convert("tf-hub", str(tmp_path / "m"), str(tmp_path / "out2"), options=str(tmp_path / "options.json"))


def test_what_cannot_be_converted_names_the_file(tmp_path, dumped):
    (tmp_path / "m").mkdir()
    with pytest.raises(ConvertError, match=r"tfhub_module\.pb: no such file; expected a TF1 Hub module dir"):
        convert("tf-hub", str(tmp_path / "m"), str(tmp_path / "out"))
    write_module(tmp_path / "bad", dumped, extra={"aggregation/weights": np.zeros(4, np.float32)})
    with pytest.raises(ConvertError, match=r"variables\.index: aggregation/weights has shape \(4,\), expected \(3,\)"):
        convert("tf-hub", str(tmp_path / "bad"), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
