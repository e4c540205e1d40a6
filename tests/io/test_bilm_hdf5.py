"""elmo_tf/io/bilm_hdf5.py (and elmo_tf/config.py): bilm-tf weight files and options.json."""

import json
import shutil

import h5py
import numpy as np
import pytest

from elmo_tf.config import BiLMConfig, get_config
from elmo_tf.io import WeightFileError, load_bilm_weights, save_bilm_weights
from elmo_tf.models import load_elmo, save_elmo

SENTENCES = [["The", "cat", "sat", "."], ["Hi"], []]
LSTM = "RNN_{d}/RNN/MultiRNNCell/Cell{l}/LSTMCell/{name}"


def expected_layout(config):
    """Dataset name -> shape of a bilm-tf weight file for `config` (P = projection, dim = LSTM size)."""
    p, dim, cd, nf = config.projection_dim, config.lstm_dim, config.char_embedding_dim, config.num_filters
    layout = {"char_embed": (261, cd)}
    for k, (width, n) in enumerate(config.filters):
        layout[f"CNN/W_cnn_{k}"] = (1, width, cd, n)
        layout[f"CNN/b_cnn_{k}"] = (n,)
    for k in range(config.num_highway):
        layout.update(
            {
                f"CNN_high_{k}/W_carry": (nf, nf),
                f"CNN_high_{k}/b_carry": (nf,),
                f"CNN_high_{k}/W_transform": (nf, nf),
                f"CNN_high_{k}/b_transform": (nf,),
            }
        )
    if nf != p:
        layout.update({"CNN_proj/W_proj": (nf, p), "CNN_proj/b_proj": (p,)})
    for d in range(2):
        for layer in range(config.num_layers):
            layout[LSTM.format(d=d, l=layer, name="W_0")] = (p + p, 4 * dim)  # input (P) + projected state (P)
            layout[LSTM.format(d=d, l=layer, name="B")] = (4 * dim,)
            layout[LSTM.format(d=d, l=layer, name="W_P_0")] = (dim, p)
    return layout


def datasets(path):
    found = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: found.__setitem__(name, obj.shape) if isinstance(obj, h5py.Dataset) else None)
    return found


def test_save_load_round_trip_is_exact(tiny_elmo, make_elmo, saved, to_char_ids):
    fresh = make_elmo(seed=99)
    load_bilm_weights(fresh, saved)
    assert len(fresh.weights) == len(tiny_elmo.weights)
    for original, loaded in zip(tiny_elmo.weights, fresh.weights):
        assert original.path == loaded.path
        if original is tiny_elmo.char_cnn.char_embedding:
            # the file holds rows 1..261; the padding row 0 is not stored and loads as zeros
            np.testing.assert_array_equal(loaded.numpy()[1:], original.numpy()[1:])
            np.testing.assert_array_equal(loaded.numpy()[0], 0.0)
        elif "scalar_weights" in original.path or "gamma" in original.path:
            continue  # the mixes are task weights, not part of a biLM file
        else:
            np.testing.assert_array_equal(loaded.numpy(), original.numpy(), err_msg=original.path)
    fresh.scalar_mixes[0].set_weights(tiny_elmo.scalar_mixes[0].get_weights())
    ids = to_char_ids(SENTENCES)
    np.testing.assert_array_equal(np.asarray(fresh(ids)["elmo"]), np.asarray(tiny_elmo(ids)["elmo"]))
    assert sorted(p.name for p in saved.parent.iterdir()) == ["weights.hdf5"]  # no temporary file left


def test_written_file_has_the_bilm_tf_layout(tiny_elmo, saved):
    found = datasets(saved)
    assert found == expected_layout(tiny_elmo.config)
    assert not any("softmax" in name.lower() for name in found)
    cnn, bilm = tiny_elmo.char_cnn, tiny_elmo.bilm
    with h5py.File(saved, "r") as f:
        assert all(f[name].dtype == np.float32 for name in found)
        np.testing.assert_array_equal(f["char_embed"][...], cnn.char_embedding.numpy()[1:])
        np.testing.assert_array_equal(f["CNN/W_cnn_1"][0], cnn.conv_kernels[1].numpy())
        np.testing.assert_array_equal(f["CNN_high_0/W_carry"][...], cnn.highway.carry_kernels[0].numpy())
        np.testing.assert_array_equal(f["CNN_high_0/W_transform"][...], cnn.highway.transform_kernels[0].numpy())
        np.testing.assert_array_equal(f["CNN_proj/W_proj"][...], cnn.projection.kernel.numpy())
        for d, direction in enumerate(("forward", "backward")):
            for layer in range(2):
                lstm = bilm.get_lstm(direction, layer)
                w_0 = f[LSTM.format(d=d, l=layer, name="W_0")][...]
                np.testing.assert_array_equal(w_0[:8], lstm.input_kernel.numpy().T)  # input rows first
                np.testing.assert_array_equal(w_0[8:], lstm.recurrent_kernel.numpy().T)
                np.testing.assert_array_equal(f[LSTM.format(d=d, l=layer, name="B")][...], lstm.bias.numpy())
                np.testing.assert_array_equal(
                    f[LSTM.format(d=d, l=layer, name="W_P_0")][...], lstm.projection_kernel.numpy().T
                )


def test_layout_matches_a_real_bilm_tf_file(fixtures_dir, tmp_path):
    options = fixtures_dir / "bilm_tf" / "model" / "options.json"
    reference = fixtures_dir / "bilm_tf" / "model" / "lm_weights.hdf5"
    model = load_elmo(options)
    save_bilm_weights(model, tmp_path / "w.hdf5")
    assert datasets(tmp_path / "w.hdf5") == datasets(reference)


def test_loads_a_real_bilm_tf_file_value_for_value(fixtures_dir):
    model_dir = fixtures_dir / "bilm_tf" / "model"
    model = load_elmo(model_dir / "options.json", model_dir / "lm_weights.hdf5")
    with h5py.File(model_dir / "lm_weights.hdf5", "r") as f:
        emb = model.char_cnn.char_embedding.numpy()
        assert emb.shape == (262, 4)
        np.testing.assert_array_equal(emb[1:], f["char_embed"][...])
        np.testing.assert_array_equal(emb[0], 0.0)
        np.testing.assert_array_equal(model.char_cnn.conv_kernels[4].numpy(), f["CNN/W_cnn_4"][0])
        lstm = model.bilm.get_lstm("backward", 1)
        w_0 = f["RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/W_0"][...]
        np.testing.assert_array_equal(lstm.input_kernel.numpy().T, w_0[:16])
        np.testing.assert_array_equal(lstm.recurrent_kernel.numpy().T, w_0[16:])
        np.testing.assert_array_equal(lstm.bias.numpy(), f["RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/B"][...])


def test_a_262_row_char_embed_is_accepted(tiny_elmo, make_elmo, saved):
    with h5py.File(saved, "r+") as f:
        rows = f["char_embed"][...]
        del f["char_embed"]
        f.create_dataset("char_embed", data=np.concatenate([np.zeros_like(rows[:1]), rows]))
    fresh = make_elmo(seed=5)
    load_bilm_weights(fresh, saved)
    loaded = fresh.char_cnn.char_embedding.numpy()
    np.testing.assert_array_equal(loaded[1:], tiny_elmo.char_cnn.char_embedding.numpy()[1:])
    np.testing.assert_array_equal(loaded[0], 0.0)


def test_save_elmo_load_elmo_round_trip(tiny_elmo, tmp_path, to_char_ids):
    save_elmo(tiny_elmo, tmp_path / "model")
    assert json.loads((tmp_path / "model" / "options.json").read_text()) == tiny_elmo.config.to_options()
    loaded = load_elmo(tmp_path / "model" / "options.json", tmp_path / "model" / "weights.hdf5")
    assert loaded.config == tiny_elmo.config
    ids = to_char_ids(SENTENCES)
    for key in ("word_emb", "lstm_outputs1", "lstm_outputs2"):
        np.testing.assert_array_equal(np.asarray(loaded(ids)[key]), np.asarray(tiny_elmo(ids)[key]), err_msg=key)


# ---------------------------------------------------------------- options.json / BiLMConfig


@pytest.mark.parametrize("name", ["tiny", "original", "medium", "small"])
def test_options_round_trip(name, tiny_config, tmp_path):
    config = tiny_config if name == "tiny" else get_config(name)
    options = config.to_options()
    assert BiLMConfig.from_options(json.loads(json.dumps(options))) == config
    config.to_json(tmp_path / "options.json")
    assert BiLMConfig.from_json(tmp_path / "options.json") == config


def test_options_layout_and_real_options_file(fixtures_dir):
    config = BiLMConfig.from_json(fixtures_dir / "bilm_tf" / "model" / "options.json")
    assert (config.projection_dim, config.lstm_dim, config.num_layers, config.num_filters) == (16, 64, 2, 124)
    assert config.use_skip_connections is False and config.cell_clip == 3 and config.num_characters == 262
    options = json.loads((fixtures_dir / "bilm_tf" / "model" / "options.json").read_text())
    assert config.to_options() == options


def test_sizes_of_the_presets():
    assert get_config("original").num_filters == 2048
    assert (get_config("small").lstm_dim, get_config("small").projection_dim) == (1024, 128)
    with pytest.raises(ValueError, match="huge"):
        get_config("huge")


def test_n_characters_261_is_rejected_with_a_hint(tiny_config, tmp_path):
    options = tiny_config.to_options()
    options["char_cnn"]["n_characters"] = 261
    with pytest.raises(ValueError, match="262"):
        BiLMConfig.from_options(options)
    (tmp_path / "options.json").write_text(json.dumps(options))
    with pytest.raises(ValueError, match="262"):
        load_elmo(tmp_path / "options.json")


def test_bad_options(tiny_config, tmp_path):
    options = tiny_config.to_options()
    del options["lstm"]["projection_dim"]
    with pytest.raises(ValueError, match="projection_dim"):
        BiLMConfig.from_options(options)
    with pytest.raises(ValueError, match="lstm_dim"):
        BiLMConfig(lstm_dim=0)
    with pytest.raises(ValueError, match="activation"):
        BiLMConfig(activation="gelu")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        BiLMConfig.from_json(tmp_path / "bad.json")


# ---------------------------------------------------------------- bad weight files


def edit(path, fn):
    with h5py.File(path, "r+") as f:
        fn(f)


def load_error(model, path):
    with pytest.raises(WeightFileError) as info:
        load_bilm_weights(model, path)
    assert isinstance(info.value, ValueError)
    return str(info.value)


def test_truncated_file(make_elmo, saved, tmp_path):
    data = saved.read_bytes()
    cut = tmp_path / "cut.hdf5"
    cut.write_bytes(data[: len(data) // 2])
    message = load_error(make_elmo(), cut)
    assert "cut.hdf5" in message and "truncated" in message


def test_not_an_hdf5_file(make_elmo, tmp_path):
    path = tmp_path / "weights.txt"
    path.write_text("this is not hdf5\n" * 100)
    message = load_error(make_elmo(), path)
    assert "weights.txt" in message and "HDF5" in message
    assert "missing.hdf5" in load_error(make_elmo(), tmp_path / "missing.hdf5")


def test_missing_dataset(make_elmo, saved):
    name = "RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/W_P_0"
    edit(saved, lambda f: f.__delitem__(name))
    message = load_error(make_elmo(), saved)
    assert name in message and "(16, 8)" in message


def test_misshaped_dataset(make_elmo, saved):
    def reshape(f):
        del f["CNN_high_0/W_carry"]
        f.create_dataset("CNN_high_0/W_carry", data=np.zeros((12, 11), np.float32))

    edit(saved, reshape)
    message = load_error(make_elmo(), saved)
    assert "CNN_high_0/W_carry" in message and "(12, 11)" in message and "(12, 12)" in message


def test_misshaped_lstm_kernel(make_elmo, saved):
    name = "RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/W_0"

    def reshape(f):
        del f[name]
        f.create_dataset(name, data=np.zeros((17, 64), np.float32))

    edit(saved, reshape)
    message = load_error(make_elmo(), saved)
    assert name in message and "(17, 64)" in message and "(16, 64)" in message


def test_file_disagrees_with_its_options(tiny_config, saved, tmp_path):
    options = tiny_config.to_options()
    options["lstm"]["projection_dim"] = 6
    (tmp_path / "options.json").write_text(json.dumps(options))
    with pytest.raises(WeightFileError) as info:
        load_elmo(tmp_path / "options.json", saved)
    message = str(info.value)
    assert "CNN_proj/W_proj" in message and "(12, 8)" in message and "(12, 6)" in message


@pytest.mark.parametrize("value", [np.nan, np.inf], ids=["nan", "inf"])
def test_non_finite_values(make_elmo, saved, value):
    name = "RNN_0/RNN/MultiRNNCell/Cell1/LSTMCell/B"

    def poison(f):
        data = f[name][...]
        data[3] = value
        f[name][...] = data

    edit(saved, poison)
    message = load_error(make_elmo(), saved)
    assert name in message and "NaN" in message


def test_a_weights_file_that_is_a_group(make_elmo, saved):
    def regroup(f):
        del f["CNN/b_cnn_0"]
        f.create_group("CNN/b_cnn_0")

    edit(saved, regroup)
    assert "CNN/b_cnn_0" in load_error(make_elmo(), saved)


def test_shutil_copy_of_a_saved_file_loads(make_elmo, saved, tmp_path):
    """Guard for the corrupt-file tests above: an unmodified copy loads without error."""
    copy = tmp_path / "copy.hdf5"
    shutil.copy(saved, copy)
    load_bilm_weights(make_elmo(seed=3), copy)
