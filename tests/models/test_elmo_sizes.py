"""elmo_tf/models/elmo.py: `load_elmo` and `ELMo.from_preset` compare the shapes the options imply with the weight
file's actual shapes (its metadata) before building anything, so options bigger than their weight file never
allocate a model; the `embed` command says so in one line."""

import dataclasses
import json

import pytest
from cli_testlib import assert_one_error, run_command

import elmo_tf.models.elmo as elmo_module
from elmo_tf.config import MAX_DIM, ConfigError
from elmo_tf.io import WeightFileError, save_bilm_weights
from elmo_tf.models import ELMo, load_elmo

W_0 = "RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/W_0"


@pytest.fixture
def model_dir(tiny_config, tiny_elmo, tmp_path):
    directory = tmp_path / "model"
    directory.mkdir()
    tiny_config.to_json(directory / "options.json")
    save_bilm_weights(tiny_elmo, directory / "weights.hdf5")
    return directory


@pytest.fixture
def never_built(monkeypatch):
    def built(*args, **kwargs):
        raise AssertionError("layers were built for options the weight file cannot fill")

    monkeypatch.setattr(elmo_module, "build_bilm_layers", built)


def test_options_bigger_than_the_weight_file_build_nothing(model_dir, tiny_config, never_built):
    dataclasses.replace(tiny_config, lstm_dim=MAX_DIM).to_json(model_dir / "options.json")
    weights = model_dir / "weights.hdf5"
    with pytest.raises(WeightFileError) as info:
        load_elmo(model_dir / "options.json", weights)
    assert str(info.value) == (
        f"{weights}: dataset {W_0!r} has shape (16, 64), expected (16, {4 * MAX_DIM}) from the options"
    )
    with pytest.raises(WeightFileError, match="has shape"):
        ELMo.from_preset(str(model_dir))


def test_a_huge_dimension_with_a_real_weight_file_is_refused_first(model_dir, never_built):
    options = json.loads((model_dir / "options.json").read_text())
    options["lstm"]["dim"] = 10**9
    (model_dir / "options.json").write_text(json.dumps(options))
    with pytest.raises(ConfigError, match=r"options\.json: lstm\.dim must be <= 65536"):
        load_elmo(model_dir / "options.json", model_dir / "weights.hdf5")


def test_a_weight_file_that_fits_still_loads(model_dir, tiny_elmo):
    model = load_elmo(model_dir / "options.json", model_dir / "weights.hdf5")
    assert model.bilm.get_lstm("forward", 0).bias.numpy().tolist() == (
        tiny_elmo.bilm.get_lstm("forward", 0).bias.numpy().tolist()
    )


@pytest.mark.parametrize(
    "dim,flag,needle", [(10**9, "--options", "lstm.dim must be <= 65536"), (4096, "--weights", repr(W_0))]
)
def test_the_cli_refuses_in_one_line(model_dir, tiny_config, tmp_path, dim, flag, needle):
    options = tiny_config.to_options()
    options["lstm"]["dim"] = dim
    (model_dir / "options.json").write_text(json.dumps(options))
    (tmp_path / "in.txt").write_text("The cat sat .\n", encoding="utf-8")
    result = run_command(
        [
            *("-m", "elmo_tf", "embed", "--options", model_dir / "options.json"),
            *("--weights", model_dir / "weights.hdf5", "--input", tmp_path / "in.txt", "--output", tmp_path / "o.hdf5"),
        ]
    )
    assert_one_error(result, 1, flag, needle)
