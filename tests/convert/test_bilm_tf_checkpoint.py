"""elmo_tf/convert/bilm_tf_checkpoint.py: a bilm-tf training checkpoint (TF1 Saver, written here by a TF1 graph under
the training graph's names, with Adagrad slots, global_step and train_perplexity) converts to exactly the weight file
bilm-tf's dump_weights wrote for the same weights: bilm-tf's own test fixture `lm_weights.hdf5`, bit for bit; the
softmax to softmax.hdf5; a moved dir converts; what cannot be converted is one error naming the file."""

import json
import os
import shutil

import numpy as np
import pytest
from convert_testlib import (
    FIXTURES,
    RECORDED,
    random_softmax,
    read_hdf5,
    save_tf1_checkpoint,
    training_name,
    training_variables,
    write_training_dir,
)

from elmo_tf.convert import ConvertError, convert
from elmo_tf.convert.bilm_tf_checkpoint import hdf5_name


@pytest.fixture
def dumped():
    """The weights bilm-tf's dump_weights wrote (its test fixture), {name: float32 array}."""
    if not (FIXTURES / "lm_weights.hdf5").is_file():
        pytest.skip(f"bilm-tf fixtures not found at {FIXTURES}")
    return read_hdf5(FIXTURES / "lm_weights.hdf5")


@pytest.fixture
def softmax():
    return random_softmax(11, 16)


def test_the_names_are_dump_weights_renames():
    for name, variable in RECORDED.items():
        assert training_name(name) == variable and hdf5_name(variable) == name
    assert hdf5_name("lm/char_embed") == "char_embed" and hdf5_name("lm/CNN_high_1/W_carry") == "CNN_high_1/W_carry"
    for ignored in ("lm/char_embed/Adagrad", "lm/softmax/W", "global_step", "train_perplexity", "lm/embedding"):
        assert hdf5_name(ignored) is None, ignored
    # a 1-layer biLM has no MultiRNNCell in the training graph; written as Cell0, the name the readers know
    assert hdf5_name("lm/RNN_0/rnn/lstm_cell/kernel") == "RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/W_0"


def test_converts_to_what_dump_weights_wrote_bit_for_bit(tmp_path, dumped, softmax):
    assert dumped["char_embed"].shape == (261, 4)  # dump_weights writes the training variable as is: 261 rows
    write_training_dir(tmp_path / "run", dumped, softmax, steps=(900, 1250))
    written = convert("bilm-tf-checkpoint", str(tmp_path / "run"), str(tmp_path / "out"))
    assert sorted(os.path.basename(p) for p in written) == ["options.json", "softmax.hdf5", "weights.hdf5"]
    got = read_hdf5(tmp_path / "out" / "weights.hdf5")
    assert sorted(got) == sorted(dumped)  # no slot, no softmax, no counter in the weight file
    for name, array in dumped.items():
        assert got[name].dtype == np.float32 and got[name].shape == array.shape, name
        assert got[name].tobytes() == array.astype(np.float32).tobytes(), name
    sm = read_hdf5(tmp_path / "out" / "softmax.hdf5")
    assert sorted(sm) == ["softmax/W", "softmax/b"]
    assert sm["softmax/W"].tobytes() == softmax[0].tobytes() and sm["softmax/b"].tobytes() == softmax[1].tobytes()
    options = json.loads((tmp_path / "out" / "options.json").read_text())
    reference = json.loads((FIXTURES / "options.json").read_text())
    assert options["char_cnn"] == reference["char_cnn"] and options["lstm"] == reference["lstm"]  # 262 chars again
    assert options["n_tokens_vocab"] == 11  # the training keys are kept
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no temporary left


def test_a_moved_dir_converts_and_the_newest_step_is_taken(tmp_path, dumped, softmax):
    write_training_dir(tmp_path / "run", dumped, softmax, steps=(900, 1250))
    state = (tmp_path / "run" / "checkpoint").read_text()
    assert str(tmp_path / "run" / "model.ckpt-1250") in state  # absolute paths: broken once the dir moves
    shutil.move(tmp_path / "run", tmp_path / "moved")
    convert("bilm-tf-checkpoint", str(tmp_path / "moved"), str(tmp_path / "out"))
    got = read_hdf5(tmp_path / "out" / "weights.hdf5")
    np.testing.assert_array_equal(got["CNN/W_cnn_0"], dumped["CNN/W_cnn_0"])  # step 1250, not 900
    # without the state file: the largest step by number (1250), not by name ("900" sorts after "1250")
    os.remove(tmp_path / "moved" / "checkpoint")
    convert("bilm-tf-checkpoint", str(tmp_path / "moved"), str(tmp_path / "out2"))
    np.testing.assert_array_equal(read_hdf5(tmp_path / "out2" / "weights.hdf5")["CNN/W_cnn_0"], dumped["CNN/W_cnn_0"])


def test_the_step_the_state_file_names_is_taken(tmp_path, dumped, softmax):
    write_training_dir(tmp_path / "run", dumped, softmax, steps=(1250, 900))  # 900 saved last, holds `dumped`
    assert 'model_checkpoint_path: "' in (tmp_path / "run" / "checkpoint").read_text()
    convert("bilm-tf-checkpoint", str(tmp_path / "run"), str(tmp_path / "out"))
    np.testing.assert_array_equal(read_hdf5(tmp_path / "out" / "weights.hdf5")["char_embed"], dumped["char_embed"])


def test_options_flag_replaces_a_missing_options_json(tmp_path, dumped, softmax):
    write_training_dir(tmp_path / "run", dumped, softmax)
    options = tmp_path / "elsewhere.json"
    os.replace(tmp_path / "run" / "options.json", options)
    with pytest.raises(ConvertError, match=r"options\.json: no such file; expected bilm-tf's options\.json"):
        convert("bilm-tf-checkpoint", str(tmp_path / "run"), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
    convert("bilm-tf-checkpoint", str(tmp_path / "run"), str(tmp_path / "out"), options=str(options))
    assert (tmp_path / "out" / "weights.hdf5").is_file()


def test_what_cannot_be_converted_names_the_file(tmp_path, dumped, softmax):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConvertError, match=r"empty: no TF checkpoint in it; expected model\.ckpt-<step>\.index"):
        convert("bilm-tf-checkpoint", str(tmp_path / "empty"), str(tmp_path / "out"))
    # a checkpoint without the biLM (only counters)
    save_tf1_checkpoint(str(tmp_path / "empty" / "model.ckpt"), {"global_step": np.int64(3)}, step=3)
    with pytest.raises(ConvertError, match=r"model\.ckpt-3\.index: holds no bilm-tf biLM variables"):
        convert("bilm-tf-checkpoint", str(tmp_path / "empty"), str(tmp_path / "out"))
    # shapes that disagree with options.json
    write_training_dir(tmp_path / "run", dumped, softmax)
    options = json.loads((tmp_path / "run" / "options.json").read_text())
    options["lstm"]["dim"] = 32
    (tmp_path / "run" / "options.json").write_text(json.dumps(options))
    with pytest.raises(ConvertError) as e:
        convert("bilm-tf-checkpoint", str(tmp_path / "run"), str(tmp_path / "out"))
    assert str(e.value) == (
        f"{tmp_path / 'run' / 'model.ckpt-1250.index'}: 'RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/W_0' has shape "
        f"(32, 256), expected (32, 128) from {tmp_path / 'run' / 'options.json'}"
    )
    # a missing data file
    options["lstm"]["dim"] = 64
    (tmp_path / "run" / "options.json").write_text(json.dumps(options))
    os.remove(tmp_path / "run" / "model.ckpt-1250.data-00000-of-00001")
    with pytest.raises(
        ConvertError, match=r"model\.ckpt-1250\.index: cannot read (variable '\S+' of )?the TF checkpoint"
    ):
        convert("bilm-tf-checkpoint", str(tmp_path / "run"), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".")]


def test_slots_of_any_optimizer_and_unknown_names_are_left_out(tmp_path, dumped, softmax):
    variables = training_variables(dumped, softmax)
    variables["lm/CNN/W_cnn_0/Adam_1"] = np.zeros((1, 1, 4, 4), np.float32)
    variables["lm/some_new_thing"] = np.zeros(3, np.float32)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "options.json").write_text((FIXTURES / "options.json").read_text())
    save_tf1_checkpoint(str(tmp_path / "run" / "model.ckpt"), variables, step=1)
    convert("bilm-tf-checkpoint", str(tmp_path / "run"), str(tmp_path / "out"))
    assert sorted(read_hdf5(tmp_path / "out" / "weights.hdf5")) == sorted(dumped)


def test_a_one_layer_bilm_loads_after_conversion(tmp_path, tiny_config):
    """bilm-tf builds a 1-layer biLM without a MultiRNNCell (lm/RNN_d/rnn/lstm_cell/...): converted under Cell0, the
    name the weight readers know, it loads into the same model as its own weights."""
    import dataclasses

    from elmo_tf.models import ELMo, load_elmo, save_elmo

    config = dataclasses.replace(tiny_config, num_layers=1)
    save_elmo(ELMo(config), str(tmp_path / "ours"))
    weights = read_hdf5(tmp_path / "ours" / "weights.hdf5")
    variables = {training_name(name).replace("multi_rnn_cell/cell_0/", ""): array for name, array in weights.items()}
    assert "lm/RNN_1/rnn/lstm_cell/projection/kernel" in variables
    (tmp_path / "run").mkdir()
    options = config.to_options()
    options["char_cnn"]["n_characters"] = 261
    (tmp_path / "run" / "options.json").write_text(json.dumps(options))
    save_tf1_checkpoint(str(tmp_path / "run" / "model.ckpt"), variables, step=7)
    convert("bilm-tf-checkpoint", str(tmp_path / "run"), str(tmp_path / "out"))
    got = read_hdf5(tmp_path / "out" / "weights.hdf5")
    assert sorted(got) == sorted(weights) and all(np.array_equal(got[k], weights[k]) for k in weights)
    model = load_elmo(str(tmp_path / "out" / "options.json"), str(tmp_path / "out" / "weights.hdf5"))
    reference = load_elmo(str(tmp_path / "ours" / "options.json"), str(tmp_path / "ours" / "weights.hdf5"))
    for a, b in zip(model.weights, reference.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
