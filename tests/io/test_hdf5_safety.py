"""elmo_tf/io/hdf5_safety.py, and the loaders that read hdf5 files from outside through it (bilm_hdf5, softmax,
token_embeddings, token_cache): a file that points outside itself (an external link, to a dataset or a group; a soft
link; a virtual dataset; external storage; a filter plugin) is refused in one line naming the dataset, before any
data is read, and no value of the other file ever becomes a weight."""

import time

import h5py
import numpy as np
import pytest
from cli_testlib import assert_one_error, run_command
from hdf5_refs_testlib import KINDS, SECRET, make_reference, message_names

from elmo_tf.io import WeightFileError, load_bilm_weights, save_bilm_weights
from elmo_tf.io.bilm_hdf5 import WeightFileReferenceError, file_shapes, weight_map
from elmo_tf.io.hdf5_safety import BUILTIN_FILTERS, HDF5ReferenceError, check_self_contained, open_self_contained
from elmo_tf.io.softmax import check_softmax, load_softmax_weights, softmax_shapes
from elmo_tf.io.token_cache import TokenCache
from elmo_tf.io.token_embeddings import TokenEmbeddingError, load_token_embeddings, write_token_embeddings
from elmo_tf.models import load_elmo

BIAS = "RNN_0/RNN/MultiRNNCell/Cell1/LSTMCell/B"  # (64,) in the tiny config, nested four groups deep
W_0 = "RNN_1/RNN/MultiRNNCell/Cell0/LSTMCell/W_0"  # (16, 64)


def one_line_naming(error, path, kind, name):
    message = str(error)
    assert message.startswith(f"{path}: ") and "\n" not in message, message
    assert message_names(message, kind, name), (kind, name, message)
    assert str(SECRET) not in message and "777" not in message
    return message


# ---------------------------------------------------------------- the check itself


@pytest.mark.parametrize("kind", KINDS)
def test_every_way_out_is_refused_naming_the_dataset(tmp_path, kind):
    path = tmp_path / "data.hdf5"
    with h5py.File(path, "w") as f:
        f.create_group("a/b")["c"] = np.zeros(3, np.float32)
        f["a/b/d"] = np.zeros(3, np.float32)
    name = make_reference(kind, path, "a/b/d", (3,))
    with h5py.File(path, "r") as f:
        with pytest.raises(HDF5ReferenceError) as info:
            check_self_contained(f, path)
    one_line_naming(info.value, path, kind, name)
    assert info.value.path == str(path)
    with pytest.raises(HDF5ReferenceError):
        open_self_contained(path)


def test_what_each_message_says(tmp_path):
    path = tmp_path / "data.hdf5"
    expected = {
        "external_link": "'a/d' is an external link to '/secret' in the file '",
        "virtual": "dataset 'a/d' is a virtual dataset mapped from 'secret' in '",
        "external_storage": "dataset 'a/d' keeps its data in external storage: the file(s) '",
        "plugin_filter": "dataset 'a/d' needs the filter 32015 (",
    }
    for kind, needle in expected.items():
        with h5py.File(path, "w") as f:
            f["a/d"] = np.zeros(3, np.float32)
        make_reference(kind, path, "a/d", (3,))
        with pytest.raises(HDF5ReferenceError, match="a file from outside is read only when it holds its data"):
            open_self_contained(path)
        with pytest.raises(HDF5ReferenceError) as info:
            open_self_contained(path)
        assert needle in str(info.value) and info.value.key == "a/d", str(info.value)


def test_a_soft_link_within_the_file_and_a_dangling_external_link(tmp_path):
    path = tmp_path / "data.hdf5"
    with h5py.File(path, "w") as f:
        f["a/d"] = np.zeros(3, np.float32)
        f["b"] = h5py.SoftLink("/a/d")
    with pytest.raises(HDF5ReferenceError, match=r"'b' is a soft link to '/a/d'"):
        open_self_contained(path)
    with h5py.File(path, "w") as f:
        f["a/d"] = h5py.ExternalLink(str(tmp_path / "nowhere.hdf5"), "/x")
    with pytest.raises(HDF5ReferenceError, match=r"'a/d' is an external link to '/x' in the file '.*nowhere.hdf5'"):
        open_self_contained(path)


def test_built_in_filters_and_layouts_pass(tmp_path):
    path = tmp_path / "data.hdf5"
    data = np.arange(1000, dtype=np.float32)
    with h5py.File(path, "w") as f:
        f.create_dataset("deflate", data=data, chunks=(100,), compression="gzip", shuffle=True, fletcher32=True)
        f.create_dataset("lzf", data=data, chunks=(100,), compression="lzf")
        f.create_dataset("scaleoffset", data=np.arange(1000), chunks=(100,), scaleoffset=0)
        f["contiguous"] = data
        f.attrs["note"] = "attributes are in the object header"
    with open_self_contained(path) as f:
        plists = [f[name].id.get_create_plist() for name in ("deflate", "lzf", "scaleoffset")]
        used = {p.get_filter(i)[0] for p in plists for i in range(p.get_nfilters())}
        assert used <= set(BUILTIN_FILTERS) and {1, 2, 3, 6, 32000} <= used
        np.testing.assert_array_equal(f["deflate"][...], data)


def test_missing_directory_and_not_hdf5_keep_their_messages(tmp_path):
    with pytest.raises(WeightFileError, match="no such weight file$"):
        open_self_contained(tmp_path / "nope.hdf5", "weight file", WeightFileError)
    with pytest.raises(WeightFileError, match="is a directory, not an HDF5 weight file$"):
        open_self_contained(tmp_path, "weight file", WeightFileError)
    (tmp_path / "x.txt").write_text("not hdf5\n")
    with pytest.raises(WeightFileError, match=r"cannot read the weight file \(truncated, or not HDF5\)"):
        open_self_contained(tmp_path / "x.txt", "weight file", WeightFileError)


def test_the_check_reads_metadata_only(tmp_path):
    """2,000 datasets of 1 MiB each in 10 groups, never written (chunked: no data on disk, but 2 GiB to read): the
    walk opens their headers only."""
    path = tmp_path / "big.hdf5"
    with h5py.File(path, "w") as f:
        for i in range(2000):
            f.create_dataset(f"g{i % 10}/{i}", shape=(1 << 18,), dtype="f4", chunks=(1 << 16,))
    start = time.perf_counter()
    with h5py.File(path, "r") as f:
        check_self_contained(f, path)
    assert time.perf_counter() - start < 5.0


# ---------------------------------------------------------------- the weight file (load_elmo, load_bilm_weights)


@pytest.mark.parametrize("kind", KINDS)
def test_a_weight_file_pointing_outside_is_refused(options, saved, make_elmo, kind):
    name = make_reference(kind, saved, BIAS, (64,))
    with pytest.raises(WeightFileReferenceError) as info:
        load_elmo(options, saved)
    one_line_naming(info.value, saved, kind, name)
    assert isinstance(info.value, WeightFileError) and isinstance(info.value, HDF5ReferenceError)
    model = make_elmo(seed=5)
    before = [v.numpy().copy() for v in model.weights]
    with pytest.raises(WeightFileReferenceError):
        load_bilm_weights(model, saved)
    for old, var in zip(before, model.weights):  # no value of the other file became a weight
        np.testing.assert_array_equal(old, var.numpy())
        assert not np.any(var.numpy() == SECRET)


def test_an_external_link_with_the_exact_shape_of_a_big_dataset(options, saved):
    name = make_reference("external_link", saved, W_0, (16, 64))
    with pytest.raises(WeightFileError, match=f"'{W_0}' is an external link to '/secret'"):
        load_elmo(options, saved)
    assert name == W_0


def test_the_cli_refuses_it_in_one_line(tiny_config, tiny_elmo, tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    tiny_config.to_json(model_dir / "options.json")
    save_bilm_weights(tiny_elmo, model_dir / "weights.hdf5")
    make_reference("external_link", model_dir / "weights.hdf5", BIAS, (64,))
    (tmp_path / "in.txt").write_text("The cat sat .\n", encoding="utf-8")
    result = run_command(
        [
            *("-m", "elmo_tf", "embed", "--options", model_dir / "options.json"),
            *("--weights", model_dir / "weights.hdf5", "--input", tmp_path / "in.txt", "--output", tmp_path / "o.hdf5"),
        ]
    )
    line = assert_one_error(result, 1, "--weights", "weights.hdf5", repr(BIAS), "external link")
    assert "777" not in line and not (tmp_path / "o.hdf5").exists()


def test_a_clean_file_loads_the_same_numbers(tiny_elmo, make_elmo, saved):
    fresh = make_elmo(seed=9)
    load_bilm_weights(fresh, saved)
    for a, b in zip(tiny_elmo.char_cnn.weights + tiny_elmo.bilm.weights, fresh.char_cnn.weights + fresh.bilm.weights):
        skip = 1 if a is tiny_elmo.char_cnn.char_embedding else 0  # the padding row is not in the file: zeros
        np.testing.assert_array_equal(a.numpy()[skip:], b.numpy()[skip:])


def test_file_shapes_are_the_variables_shapes(make_elmo, tiny_config):
    """One expected layout, from the options alone, is what load_bilm_weights checks and what the model holds."""
    import dataclasses

    for config in (tiny_config, dataclasses.replace(tiny_config, projection_dim=12, lstm_dim=12, always_project=True)):
        model = make_elmo(config, randomize=False)
        shapes = file_shapes(config)
        assert [name for name, *_ in weight_map(model)] == list(shapes)
        for name, variables, to_file, _ in weight_map(model):
            assert to_file([v.numpy() for v in variables]).shape == shapes[name][0], name
        total = sum(int(np.prod(v.shape)) for v in model.char_cnn.weights + model.bilm.weights)
        assert sum(config.parameter_parts().values()) == total


# ---------------------------------------------------------------- the softmax, the token embeddings and their cache


@pytest.fixture
def softmax(tmp_path):
    path = tmp_path / "softmax.hdf5"
    with h5py.File(path, "w") as f:
        f["softmax/W"] = np.ones((5, 8), np.float32)
        f["softmax/b"] = np.zeros(5, np.float32)
    return path


@pytest.mark.parametrize("kind", KINDS)
def test_a_softmax_pointing_outside_is_refused(softmax, kind):
    name = make_reference(kind, softmax, "softmax/W", (5, 8))
    for read in (lambda: softmax_shapes(softmax), lambda: check_softmax(softmax, 5, 8)):
        with pytest.raises(WeightFileError) as info:
            read()
        one_line_naming(info.value, softmax, kind, name)
    import keras

    kernel, bias = keras.Variable(np.zeros((5, 8), np.float32)), keras.Variable(np.zeros(5, np.float32))
    with pytest.raises(WeightFileError):
        load_softmax_weights(softmax, kernel, bias)
    assert not np.any(kernel.numpy() == SECRET)


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "external_group"])  # "embedding" has no parent group
def test_token_embeddings_pointing_outside_are_refused(tmp_path, kind):
    path, tokens = tmp_path / "tokens.hdf5", ["the", "cat", "sat"]
    write_token_embeddings(path, np.ones((3, 8), np.float32), vocabulary=tokens)
    name = make_reference(kind, path, "embedding", (3, 8))
    with pytest.raises(TokenEmbeddingError) as info:
        load_token_embeddings(path, tokens, projection_dim=8)
    one_line_naming(info.value, path, kind, name)
    with pytest.raises(TokenEmbeddingError) as info:
        TokenCache.load(path, tokens, projection_dim=8)
    one_line_naming(info.value, path, kind, name)


def test_token_embeddings_in_a_group_linked_from_outside(tmp_path):
    """The file's only dataset under a group that is an external link: the root link is refused."""
    path, tokens = tmp_path / "tokens.hdf5", ["the", "cat"]
    secret = tmp_path / "secret.hdf5"
    with h5py.File(secret, "w") as g:
        g["embedding"] = np.full((2, 8), SECRET, np.float32)
    with h5py.File(path, "w") as f:
        f["embedding"] = h5py.ExternalLink(str(secret), "/embedding")
    with pytest.raises(TokenEmbeddingError, match=r"'embedding' is an external link to '/embedding'"):
        load_token_embeddings(path, tokens)
