"""Weight files of bilm-tf / AllenNLP (`options.json` + `weights.hdf5`), read and written.

Layout (the released ELMo files):
    char_embed                                   (261, char_dim)   a zero row 0 is prepended at load time
    CNN/W_cnn_{k}, CNN/b_cnn_{k}                 (1, width, char_dim, n), (n,)
    CNN_high_{k}/W_carry, b_carry, W_transform, b_transform     "carry" = the gate on the nonlinear branch
    CNN_proj/W_proj, b_proj                      only when the filter total differs from projection_dim
    RNN_{d}/RNN/MultiRNNCell/Cell{l}/LSTMCell/W_0   (input + projection_dim, 4 * dim): input rows first
                                            /B     (4 * dim,) i, j, f, o; without the forget bias +1
                                            /W_P_0 (dim, projection_dim)
    d = 0 forward, 1 backward. The softmax is not in the file.
    word_embed                                   (words, word_dim)  converted ELMoForManyLangs models with a word
                                                 embedding (a zero row 0 is prepended); CNN_proj/W_proj's rows are
                                                 then [word; filters]
"""

import h5py
import numpy as np

from elmo_tf.errors import ElmoTFError, one_line
from elmo_tf.io.atomic import atomic_hdf5
from elmo_tf.io.hdf5_safety import HDF5ReferenceError, open_self_contained
from elmo_tf.layers.bilm import DIRECTIONS

# what h5py raises for a damaged file (a bad object header, an unreadable chunk, an unsupported type)
_H5_ERRORS = (OSError, RuntimeError, KeyError, ValueError, TypeError)


class WeightFileError(ElmoTFError):
    """A weight file that cannot be read, lacks a dataset, or disagrees with its options. The message names the
    file and the dataset."""


class WeightFileReferenceError(WeightFileError, HDF5ReferenceError):
    """A weight file that points outside itself (an external or soft link, a virtual dataset, external storage, a
    filter plugin: `elmo_tf.io.hdf5_safety`); refused before any dataset is read."""


def open_hdf5(path, what="weight file"):
    """`h5py.File(path, "r")` of a file that holds its data itself (`elmo_tf.io.hdf5_safety.check_self_contained`),
    or `WeightFileError` naming the file when it is missing, a directory, truncated or not HDF5 at all, and
    `WeightFileReferenceError` (a `WeightFileError` too) naming the dataset when it points outside itself."""
    return open_self_contained(path, what, error_class=WeightFileError, reference_class=WeightFileReferenceError)


def dataset_header(f, name, expected_shapes, path):
    """The `h5py.Dataset` `name` of the open file `f`, its metadata checked (no data read): it exists, is a dataset
    of real numbers and has one of `expected_shapes`. Raises `WeightFileError` naming `path` and `name`."""
    expected = " or ".join(str(s) for s in expected_shapes)
    try:
        obj = f.get(name)
        dtype, shape = (obj.dtype, obj.shape) if isinstance(obj, h5py.Dataset) else (None, None)
    except _H5_ERRORS as e:
        raise WeightFileError(f"{path}: dataset {name!r} cannot be read (corrupt file?): {one_line(e)}") from None
    if obj is None:
        raise WeightFileError(f"{path}: has no dataset {name!r} (expected shape {expected} from the options)")
    if not isinstance(obj, h5py.Dataset):
        raise WeightFileError(f"{path}: {name!r} is a {type(obj).__name__}, not a dataset of shape {expected}")
    if h5py.check_string_dtype(dtype) is not None or dtype.kind not in "fiu":
        held = "strings" if h5py.check_string_dtype(dtype) is not None else f"dtype {dtype}"
        raise WeightFileError(f"{path}: dataset {name!r} holds {held}, expected floating-point numbers")
    if shape not in expected_shapes:
        raise WeightFileError(f"{path}: dataset {name!r} has shape {shape}, expected {expected} from the options")
    return obj


def read_dataset(f, name, expected_shapes, path):
    """The array of dataset `name` of the open file `f`, checked: `dataset_header`'s checks, then it reads and holds
    no NaN or inf. Raises `WeightFileError` naming `path` and `name`."""
    obj = dataset_header(f, name, expected_shapes, path)
    try:
        data = obj[...]
    except _H5_ERRORS as e:
        raise WeightFileError(
            f"{path}: dataset {name!r} cannot be read (truncated or corrupt file?): {one_line(e)}"
        ) from None
    if not np.all(np.isfinite(data)):
        raise WeightFileError(f"{path}: dataset {name!r} holds NaN or inf values")
    return data


def _lstm_prefix(direction_index, layer):
    return f"RNN_{direction_index}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"


def weight_map(model):
    """`(dataset name, variables, to_file, from_file)` for every weight of an `ELMo` model.

    `from_file(array) -> list of arrays` (one per variable) and `to_file(list of arrays) -> array`
    convert between the file's layout and the variables'.
    """
    cnn, bilm = model.char_cnn, model.bilm
    entries = [
        ("char_embed", [cnn.char_embedding], lambda v: v[0][1:], lambda a: [np.concatenate([np.zeros_like(a[:1]), a])])
    ]
    for k, (kernel, bias) in enumerate(zip(cnn.conv_kernels, cnn.conv_biases)):
        entries.append((f"CNN/W_cnn_{k}", [kernel], lambda v: v[0][None], lambda a: [a[0]]))
        entries.append((f"CNN/b_cnn_{k}", [bias], lambda v: v[0], lambda a: [a]))
    hw = cnn.highway
    for k in range(hw.num_layers):
        for name, var in (
            ("W_carry", hw.carry_kernels[k]),
            ("b_carry", hw.carry_biases[k]),
            ("W_transform", hw.transform_kernels[k]),
            ("b_transform", hw.transform_biases[k]),
        ):
            entries.append((f"CNN_high_{k}/{name}", [var], lambda v: v[0], lambda a: [a]))
    if cnn.word_vocab_size:  # ELMoForManyLangs' word embedding: like char_embed, a zero row 0 is prepended
        entries.append(
            (
                "word_embed",
                [cnn.word_embedding],
                lambda v: v[0][1:],
                lambda a: [np.concatenate([np.zeros_like(a[:1]), a])],
            )
        )
    if cnn.use_projection:
        entries.append(("CNN_proj/W_proj", [cnn.projection.kernel], lambda v: v[0], lambda a: [a]))
        entries.append(("CNN_proj/b_proj", [cnn.projection.bias], lambda v: v[0], lambda a: [a]))
    for d, direction in enumerate(DIRECTIONS):
        for layer in range(bilm.num_layers):
            lstm = bilm.get_lstm(direction, layer)
            prefix = _lstm_prefix(d, layer)
            n_in = lstm.input_kernel.shape[1]
            # the layer stores its kernels transposed (ProjectedLSTM): W_0 = [W_x; W_h] = [input^T; recurrent^T]
            entries.append(
                (
                    f"{prefix}/W_0",
                    [lstm.input_kernel, lstm.recurrent_kernel],
                    lambda v: np.concatenate([v[0].T, v[1].T], axis=0),
                    lambda a, n=n_in: [a[:n].T, a[n:].T],
                )
            )
            entries.append((f"{prefix}/B", [lstm.bias], lambda v: v[0], lambda a: [a]))
            entries.append((f"{prefix}/W_P_0", [lstm.projection_kernel], lambda v: v[0].T, lambda a: [a.T]))
    return entries


def file_shapes(config):
    """`{dataset name: accepted shapes}` of the weight file of a `BiLMConfig`, from the options alone (nothing is
    built): what `load_bilm_weights` reads and `check_weight_file` compares, in the order of `weight_map`.

    The first accepted shape is the file's layout; `char_embed` may also hold the zero padding row already
    (`num_characters` rows instead of `num_characters - 1`).
    """
    shapes = {"char_embed": ((config.num_characters - 1, config.char_embedding_dim),)}
    shapes["char_embed"] += ((config.num_characters, config.char_embedding_dim),)
    for k, (width, n) in enumerate(config.filters):
        shapes[f"CNN/W_cnn_{k}"] = ((1, width, config.char_embedding_dim, n),)
        shapes[f"CNN/b_cnn_{k}"] = ((n,),)
    filters = config.num_filters
    for k in range(config.num_highway):
        for name in ("carry", "transform"):
            shapes[f"CNN_high_{k}/W_{name}"] = ((filters, filters),)
            shapes[f"CNN_high_{k}/b_{name}"] = ((filters,),)
    if config.word_embedding_dim:  # ELMoForManyLangs: the file holds no zero row 0 ("no token")
        shapes["word_embed"] = ((config.num_words, config.word_embedding_dim),)
    token_dim, projection = filters + config.word_embedding_dim, config.projection_dim
    if config.always_project or token_dim != projection:  # as CharCNN.use_projection
        shapes["CNN_proj/W_proj"] = ((token_dim, projection),)
        shapes["CNN_proj/b_proj"] = ((projection,),)
    for d in range(len(DIRECTIONS)):
        for layer in range(config.num_layers):
            prefix = _lstm_prefix(d, layer)
            shapes[f"{prefix}/W_0"] = ((2 * projection, 4 * config.lstm_dim),)  # [input; recurrent] rows
            shapes[f"{prefix}/B"] = ((4 * config.lstm_dim,),)
            shapes[f"{prefix}/W_P_0"] = ((config.lstm_dim, projection),)
    return shapes


def check_weight_file(config, weights_path):
    """Raises `WeightFileError` naming the file and the first dataset that `config` implies and the weight file does
    not hold with that shape (or holds as strings), from the file's metadata only: no data is read and nothing is
    built, so options too big for their weight file never allocate a model (`elmo_tf.models.load_elmo`). Also
    refuses a file that points outside itself (`open_hdf5`)."""
    with open_hdf5(weights_path) as f:
        for name, shapes in file_shapes(config).items():
            dataset_header(f, name, shapes, weights_path)


def load_bilm_weights(model, weights_path):
    """Loads a bilm-tf/AllenNLP `weights.hdf5` into an `ELMo` model, checking every dataset's shape.

    Raises:
        WeightFileError: a missing, truncated, corrupt or non-HDF5 file, one that points outside itself
            (`WeightFileReferenceError`: an external or soft link, a virtual dataset, external storage, a filter
            plugin), a missing dataset, a dataset of strings, NaN/inf values, or a shape that disagrees with the
            model's options (the message names the file, the dataset, the expected and found shapes). No variable
            changes unless all is well.
    """
    entries, shapes = weight_map(model), file_shapes(model.config)
    if [name for name, *_ in entries] != list(shapes):
        raise ValueError(f"the variables of {type(model).__name__} are not those of its config: {list(shapes)[:3]}...")

    with open_hdf5(weights_path) as f:
        # pass 1 reads and checks every dataset, one at a time (memory: the largest dataset, not the whole file),
        # so no variable changes unless all is well; pass 2 reads each again and assigns it
        for name, _, _, _ in entries:
            read_dataset(f, name, shapes[name], weights_path)
        for name, variables, _, from_file in entries:
            data = read_dataset(f, name, shapes[name], weights_path)
            padded = name == "char_embed" and data.shape == tuple(variables[0].shape)  # the zero row already there
            arrays = [data] if padded else from_file(data)
            for var, array in zip(variables, arrays):
                var.assign(array.astype(var.dtype, copy=False))


def save_bilm_weights(model, weights_path):
    """Writes an `ELMo` model's weights in the bilm-tf/AllenNLP layout (261-row char_embed, no softmax).

    Written atomically (`elmo_tf.io.atomic.atomic_hdf5`): an existing file is never left half-written; a full disk
    raises `elmo_tf.io.atomic.WriteError` naming the file, with the old file kept.
    """
    with atomic_hdf5(weights_path) as f:
        for name, variables, to_file, _ in weight_map(model):
            f.create_dataset(name, data=to_file([np.asarray(v.numpy()) for v in variables]).astype(np.float32))
