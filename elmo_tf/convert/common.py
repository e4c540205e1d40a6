"""What the converters share: reading TF1 checkpoints without a TF1 graph, checking shapes against the options, and
writing `options.json`, `weights.hdf5` and `softmax.hdf5` in the released bilm-tf layouts."""

import contextlib
import glob
import json
import logging
import os
import re

import numpy as np

from elmo_tf.convert import ConvertError, is_regular_file
from elmo_tf.errors import one_line

logger = logging.getLogger(__name__)

NUM_CHARS_IN_FILE = 261  # rows of `char_embed` in a bilm-tf weight file: the model's 262 without the padding row 0
WEIGHTS = "weights.hdf5"
SOFTMAX = "softmax.hdf5"
OPTIONS = "options.json"


class Checkpoint:
    """A TF1 Saver V2 checkpoint, read with `tf.train.load_checkpoint` (no graph, no TF1 session).

    Args:
        prefix: the checkpoint prefix (`dir/model.ckpt-100`, whose `.index` file exists).
    Attributes:
        prefix: as given; `shapes`: {variable name: shape tuple} of every tensor it holds.
    Raises:
        ConvertError: naming the `.index` file when TensorFlow cannot read it (truncated, a missing data file).
    """

    def __init__(self, prefix):
        self.prefix = prefix
        for path in [f"{prefix}.index", *glob.glob(glob.escape(prefix) + ".data-*")]:
            is_regular_file(path, "a TF checkpoint file")  # TensorFlow would block on a FIFO
        with self._errors():
            import tensorflow as tf

            self._reader = tf.train.load_checkpoint(prefix)
            self.shapes = {name: tuple(shape) for name, shape in self._reader.get_variable_to_shape_map().items()}

    def read(self, name):
        """The float32 array of variable `name` (as bilm-tf's dump_weights writes it: dtype float32)."""
        with self._errors(name):
            return np.asarray(self._reader.get_tensor(name)).astype(np.float32, copy=False)

    @contextlib.contextmanager
    def _errors(self, name=None):
        import tensorflow as tf

        try:
            yield
        except (tf.errors.OpError, ValueError) as e:
            what = f"variable {name!r} of " if name else ""
            raise ConvertError(
                f"{self.prefix}.index: cannot read {what}the TF checkpoint (truncated, or its .data files are "
                f"missing): {one_line(getattr(e, 'message', e))}",
                path=f"{self.prefix}.index",
            ) from None


def latest_checkpoint(directory, stem="model.ckpt"):
    """The prefix of the checkpoint to convert in `directory`: the one its `checkpoint` file names (by base name: the
    file holds absolute paths, which break when the directory is moved) if its `.index` is there, else the
    `{stem}-<step>.index` with the largest step.

    Raises:
        ConvertError: no `{stem}-*.index` in `directory`.
    """
    named = _named_in_state_file(directory)
    if named and os.path.isfile(os.path.join(directory, named + ".index")):
        return os.path.join(directory, named)
    steps = []
    for path in glob.glob(os.path.join(glob.escape(directory), f"{glob.escape(stem)}-*.index")):
        match = re.fullmatch(re.escape(stem) + r"-([0-9]+)\.index", os.path.basename(path))
        if match:
            steps.append((int(match[1]), path[: -len(".index")]))
    if not steps:
        raise ConvertError(
            f"{directory}: no TF checkpoint in it; expected {stem}-<step>.index and .data files (bilm-tf's training "
            "dir)",
            path=directory,
        )
    return max(steps)[1]


def _named_in_state_file(directory):
    """The base name in `model_checkpoint_path: "..."` of `directory/checkpoint`, or None. Raises `ConvertError` when
    `checkpoint` is not a regular file (a FIFO, a device, a directory)."""
    path = os.path.join(directory, "checkpoint")
    if not is_regular_file(path, 'TF\'s checkpoint state file (model_checkpoint_path: "...")'):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(1 << 16)
    except (OSError, UnicodeDecodeError):
        return None
    match = re.search(r'^model_checkpoint_path:\s*"([^"\n]*)"', text, flags=re.M)
    return os.path.basename(match[1].replace("\\", "/")) if match else None


def read_options(path):
    """The JSON object in `path`. Raises `ConvertError` naming the file when it is missing, not a regular file, not
    JSON or not an object."""
    is_regular_file(path, "bilm-tf's options.json")
    try:
        with open(path, encoding="utf-8") as f:
            options = json.load(f)
    except FileNotFoundError:
        raise ConvertError(f"{path}: no such file; expected bilm-tf's options.json", path=path) from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ConvertError(f"{path}: cannot read it as bilm-tf's options.json: {one_line(e)}", path=path) from None
    if not isinstance(options, dict) or not isinstance(options.get("char_cnn"), dict):
        raise ConvertError(
            f"{path}: expected bilm-tf's options.json with 'char_cnn' and 'lstm' sections (only character-input "
            "biLMs are supported)",
            path=path,
        )
    return options


def inference_options(options, path):
    """`options` as an options.json for inference: `char_cnn.n_characters` 262 (bilm-tf trains with 261, a
    zero padding row is prepended at load time); every other key kept. Checked with `BiLMConfig`; raises
    `ConvertError` naming `path` and the key."""
    from elmo_tf.config import BiLMConfig, ConfigError

    options = json.loads(json.dumps(options))  # a deep copy
    char_cnn = options["char_cnn"]
    if char_cnn.get("n_characters") in (NUM_CHARS_IN_FILE, NUM_CHARS_IN_FILE + 1):
        char_cnn["n_characters"] = NUM_CHARS_IN_FILE + 1
    try:
        config = BiLMConfig.from_options(options, source=path)
    except ConfigError as e:
        raise ConvertError(str(e), key=e.key, path=path) from None
    if config.lstm_dim == config.projection_dim:  # TF1's LSTMCell then has no projection (no W_P_0)
        raise ConvertError(
            f"{path}: lstm.dim equals lstm.projection_dim ({config.lstm_dim}): an LSTM without a projection, which "
            "elmo_tf's layers do not implement",
            key="lstm.dim",
            path=path,
        )
    return options


def check_shapes(found, options, source, options_path):
    """Raises `ConvertError` naming `source` unless `found` ({dataset name: shape}) holds exactly the datasets of a
    weight file of `options` (`inference_options`' output) with those shapes: the file's layout, the first shape
    `elmo_tf.io.bilm_hdf5.file_shapes` accepts for each (char_embed with the file's 261 rows). `found` names may carry
    a note of their source variable."""
    from elmo_tf.config import BiLMConfig
    from elmo_tf.io.bilm_hdf5 import file_shapes

    expected = {name: shapes[0] for name, shapes in file_shapes(BiLMConfig.from_options(options)).items()}
    for name, shape in expected.items():
        if name not in found:
            raise ConvertError(
                f"{source}: has no variable for {name!r} (expected shape {shape} from {options_path})", path=source
            )
        if tuple(found[name]) != shape:
            raise ConvertError(
                f"{source}: {name!r} has shape {tuple(found[name])}, expected {shape} from {options_path}",
                path=source,
            )
    extra = sorted(set(found) - set(expected))
    if extra:
        raise ConvertError(
            f"{source}: holds {extra[0]!r}, which {options_path} does not describe ({len(extra)} such)", path=source
        )


def write_outputs(out_dir, options, weights, softmax=None):
    """Writes `options.json`, `weights.hdf5` (`weights`: {dataset name: float32 array}, in order) and, when given,
    `softmax.hdf5` (`softmax`: (W, b)) into `out_dir`. Returns the written paths."""
    from elmo_tf.io.atomic import atomic_hdf5, write_json

    paths = [os.path.join(out_dir, OPTIONS), os.path.join(out_dir, WEIGHTS)]
    write_json(paths[0], options)
    with atomic_hdf5(paths[1]) as f:
        for name, array in weights.items():
            f.create_dataset(name, data=np.asarray(array, dtype=np.float32))
    if softmax is not None:
        paths.append(os.path.join(out_dir, SOFTMAX))
        with atomic_hdf5(paths[-1]) as f:
            f.create_dataset("softmax/W", data=np.asarray(softmax[0], dtype=np.float32))
            f.create_dataset("softmax/b", data=np.asarray(softmax[1], dtype=np.float32))
    return paths
