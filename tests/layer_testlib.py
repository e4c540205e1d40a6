"""The contract every public elmo_tf layer passes, in one place (as keras-hub's `TestCase.run_layer_test`):

- config: `get_config()` is JSON, names every `__init__` argument, and `from_config` (and Keras's
  serialize / deserialize by the registered name `elmo_tf>Class`) gives the same config; the clone with the same
  weights gives the same outputs, bit for bit;
- shapes: the output of a symbolic call (`keras.Input`) agrees with the eager one in dtype and in every known
  dimension, and `compute_output_shape` (where the class defines it) gives the eager output's shape;
- masking: the mask Keras attaches to the output (what the next layer receives) is the documented one, and a layer
  given a mask does not warn that it ignores it;
- padding (sequence layers): positions appended to the time axis, or batch-mates with longer sentences, leave the
  outputs at the real positions unchanged (and, unless told otherwise, give zeros / False past them);
- saving: the layer inside a small functional model, saved to `.keras`, is reloaded with `elmo_tf.load_model` in
  another Python process (`FreshProcess`) and gives the same outputs (atol 1e-6) and the same layer config.

Usage, through the fixture of tests/conftest.py (which passes the session's `fresh_process`):

    def test_layer_contract(layer_contract):
        layer_contract(CharCNN, dict(filters=((1, 4), (2, 8))), char_ids, pad_value=0, output_mask=any_nonzero)

Applying it to a new layer (BiLM, the LSTM cell): give the constructor arguments, a small input batch with some
padding in it and, for a sequence layer, `pad_value` (what an absent position holds) and `batch_mates` (a batch
with a longer sentence). Pass `mask` when the layer's call takes one, and `output_mask` for the mask it produces.
"""

import inspect
import json
import os
import queue
import subprocess
import sys
import threading
import warnings
import zipfile
from pathlib import Path

import h5py
import numpy as np

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
RELOAD_TIMEOUT_S = 600  # the first reload waits for the other process to import TensorFlow: seconds on busy cores


def any_nonzero(inputs, mask):
    """Output-mask recipe of layers reading ids: a position is real when any id along the last axis is non-zero."""
    return np.asarray(inputs).any(axis=-1)


def same_mask(inputs, mask):
    """Output-mask recipe of layers that pass their input mask through (None stays None)."""
    return mask


def run_layer_test(
    cls,
    init_kwargs,
    input_data,
    *,
    fresh_process,
    mask=None,
    output_mask=None,
    pad_value=None,
    pad_steps=2,
    batch_mates=None,
    batch_mates_mask=None,
    zeros_at_padding=True,
    weight_scale=0.3,
    safe_mode=True,
    atol=1e-6,
    padding_atol=1e-6,
):
    """Checks the layer contract above for `cls(**init_kwargs)` on `input_data`; returns `(layer, outputs)`.

    Args:
        cls: the layer class.
        init_kwargs: its constructor arguments (a dict).
        input_data: the call's first argument as NumPy arrays: one array, or a list / dict of arrays (strings as
            NumPy str arrays). Shapes `(batch, steps, ...)` for a sequence layer.
        fresh_process: a `FreshProcess` for the `.keras` reload, or None to skip that check.
        mask: optional bool `(batch, steps)`: passed as `call(mask=...)` when the call takes a `mask` argument, else
            attached to the first input as an upstream layer's output mask would be.
        output_mask: None when the layer's outputs carry no mask, else `recipe(inputs, mask) -> expected mask`
            (`same_mask`, `any_nonzero`, or your own; one mask for every output, or a list with one per output in
            `keras.tree.flatten` order, None for an output without one); called with the padded inputs too.
        pad_value: for a sequence layer, what an absent position of every input holds (0 for ids, "" for tokens,
            a large float for masked float inputs); `pad_steps` such positions are appended on axis 1 (0: no
            appended-padding check). None: neither (not a sequence layer, or inputs without a time axis).
        batch_mates: optional input batch (same structure; longer sentences, ideally) put before `input_data` in
            one batch, both padded with `pad_value` to the longer width; `batch_mates_mask` is their mask when
            `mask` is given. Giving `pad_value` or `batch_mates` makes axis 1 of every input (of rank >= 2) a time
            axis of unknown size in the saved model.
        zeros_at_padding: outputs past the real positions are zeros (False for masks) in the padding checks.
        weight_scale: every float weight is set to N(0, weight_scale^2) after building (biases too), so a weight
            that is not saved or restored shows; None keeps the initializers.
        safe_mode: False for layers Keras deserializes only in unsafe mode (`ELMoSavedModel`).
        atol: tolerance of the `.keras` reload in the other process.
        padding_atol: tolerance of the padding checks (a row's place in a batch can change the kernels' blocking).
    Returns:
        the built layer with its test weights, and its eager outputs (NumPy, same structure as the layer's).
    """
    import keras

    layer = cls(**init_kwargs)
    takes_mask = "mask" in inspect.signature(layer.call).parameters
    sequence = pad_value is not None or batch_mates is not None
    outputs = _call(layer, input_data, mask, takes_mask)  # builds the layer
    if weight_scale is not None:
        rng = np.random.default_rng(0)
        for weight in layer.weights:
            if "float" in str(weight.dtype):
                weight.assign(rng.normal(0.0, weight_scale, size=tuple(weight.shape)).astype(weight.dtype))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outputs = _call(layer, input_data, mask, takes_mask)
    if mask is not None:
        ignored = [str(w.message) for w in caught if "mask" in str(w.message)]
        assert not ignored, f"{cls.__name__} was given a mask: {ignored}"
    _check_output_mask(outputs, output_mask, input_data, mask, cls.__name__)
    _check_config(layer, input_data, mask, takes_mask, outputs, safe_mode)
    model = _functional_model(layer, input_data, mask, takes_mask, sequence)
    _check_shapes(layer, model, input_data, outputs)
    if pad_value is not None and pad_steps:
        padded = keras.tree.map_structure(lambda x: _append(x, pad_steps, pad_value), input_data)
        padded_mask = None if mask is None else _append(mask, pad_steps, False)
        again = _call(layer, padded, padded_mask, takes_mask)
        _check_real_positions(outputs, again, 0, padding_atol, zeros_at_padding, "appended padding")
        _check_output_mask(again, output_mask, padded, padded_mask, cls.__name__)
    if batch_mates is not None:
        together, together_mask = _batch(batch_mates, input_data, batch_mates_mask, mask, pad_value)
        again = _call(layer, together, together_mask, takes_mask)
        rows = len(keras.tree.flatten(batch_mates)[0])
        _check_real_positions(outputs, again, rows, padding_atol, zeros_at_padding, "batched after longer sentences")
        _check_output_mask(again, output_mask, together, together_mask, cls.__name__)
    if fresh_process is not None:
        flat = keras.tree.flatten(input_data) + ([mask] if mask is not None and takes_mask else [])
        fresh_process.check(model, flat, layer.name, safe_mode=safe_mode, atol=atol)
    return layer, keras.tree.map_structure(_numpy, outputs)


# ------------------------------------------------------------------------------------------------ in process


def _tensor(x):
    """A tensor of the Keras backend (strings, which only TensorFlow has, as tf.string)."""
    if np.asarray(x).dtype.kind in "USO":
        import tensorflow as tf

        return tf.constant(x)
    import keras

    return keras.ops.convert_to_tensor(x)


def _numpy(x):
    """A backend tensor (a PyTorch one that requires grad included) as NumPy."""
    import keras

    return x if isinstance(x, np.ndarray) else keras.ops.convert_to_numpy(x)


def _call(layer, input_data, mask, takes_mask):
    import keras

    inputs = keras.tree.map_structure(_tensor, input_data)
    if mask is None:
        return layer(inputs)
    if takes_mask:
        return layer(inputs, mask=_tensor(mask))
    from keras.src.backend.common.masking import set_keras_mask  # a JAX array holds no attribute: Keras's own way

    set_keras_mask(keras.tree.flatten(inputs)[0], _tensor(mask))  # as an upstream layer's output carries it
    return layer(inputs)


def _check_output_mask(outputs, recipe, input_data, mask, name):
    import keras
    from keras.src.backend.common.masking import get_keras_mask

    flat = keras.tree.flatten(outputs)
    masks = None if recipe is None else recipe(input_data, mask)
    if not isinstance(masks, list | tuple):
        masks = [masks] * len(flat)
    assert len(masks) == len(flat), f"{name}: the output_mask recipe gives {len(masks)} masks, not {len(flat)}"
    for k, (output, expected) in enumerate(zip(flat, masks)):
        actual = get_keras_mask(output)  # what Keras hands the next layer
        if expected is None:
            assert actual is None, f"{name}: output {k} carries a mask; none is documented"
        else:
            assert actual is not None, f"{name}: output {k} carries no mask"
            np.testing.assert_array_equal(_numpy(actual), np.asarray(expected), err_msg=f"{name}: output {k} mask")


def _json(config):
    return json.dumps(config, sort_keys=True)


def _check_config(layer, input_data, mask, takes_mask, outputs, safe_mode):
    import keras

    cls = type(layer)
    config = layer.get_config()
    expected = _json(config)  # raises unless the config is JSON
    arguments = [
        p.name
        for p in inspect.signature(cls.__init__).parameters.values()
        if p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    ]
    missing = [a for a in arguments if a not in config]
    assert not missing, f"{cls.__name__}.get_config() leaves out __init__ arguments {missing}"
    assert keras.saving.get_registered_name(cls) == f"elmo_tf>{cls.__name__}", "not registered under elmo_tf"
    unsafe = {} if safe_mode else {"safe_mode": False}
    clone = cls.from_config(config, **unsafe)
    assert _json(clone.get_config()) == expected, f"{cls.__name__}.from_config(config).get_config() differs"
    serialized = json.loads(json.dumps(keras.saving.serialize_keras_object(layer)))
    revived = keras.saving.deserialize_keras_object(serialized, **unsafe)
    assert type(revived) is cls and _json(revived.get_config()) == expected, "serialize/deserialize changed it"
    _call(clone, input_data, mask, takes_mask)  # builds the clone
    assert [(w.name, tuple(w.shape)) for w in clone.weights] == [(w.name, tuple(w.shape)) for w in layer.weights]
    clone.set_weights(layer.get_weights())
    for k, (a, b) in enumerate(zip(keras.tree.flatten(_call(clone, input_data, mask, takes_mask)), _flat(outputs))):
        np.testing.assert_array_equal(_numpy(a), b, err_msg=f"clone from config, output {k}")


def _flat(outputs):
    import keras

    return [_numpy(x) for x in keras.tree.flatten(outputs)]


def _functional_model(layer, input_data, mask, takes_mask, sequence):
    """`keras.Model` over the flat inputs (and the mask when the call takes one) -> `layer`'s outputs."""
    import keras

    def spec(x, name):
        x = np.asarray(x)
        shape = list(x.shape[1:])
        if sequence and x.ndim >= 2:
            shape[0] = None  # the time axis
        dtype = "string" if x.dtype.kind in "USO" else str(x.dtype)
        return keras.Input(tuple(shape), dtype=dtype, name=name)

    flat = keras.tree.flatten(input_data)
    inputs = [spec(x, f"input_{k}") for k, x in enumerate(flat)]
    structured = keras.tree.pack_sequence_as(input_data, inputs)
    if mask is not None and takes_mask:
        mask_input = spec(mask, "mask")
        return keras.Model(inputs + [mask_input], layer(structured, mask=mask_input))
    return keras.Model(inputs[0] if len(inputs) == 1 else inputs, layer(structured))


def _check_shapes(layer, model, input_data, outputs):
    import keras

    name = type(layer).__name__
    symbolic = keras.tree.flatten(model.outputs)
    eager = keras.tree.flatten(outputs)
    assert len(symbolic) == len(eager), f"{name}: {len(symbolic)} symbolic outputs, {len(eager)} eager ones"
    for k, (s, e) in enumerate(zip(symbolic, eager)):
        assert keras.backend.standardize_dtype(s.dtype) == keras.backend.standardize_dtype(e.dtype), (
            f"{name}: output {k} is {e.dtype} eagerly, {s.dtype} symbolically"
        )
        assert len(s.shape) == len(e.shape) and all(d in (None, n) for d, n in zip(s.shape, e.shape)), (
            f"{name}: output {k} has shape {tuple(e.shape)} eagerly, {s.shape} symbolically"
        )
    if type(layer).compute_output_shape is not keras.layers.Layer.compute_output_shape:
        shapes = keras.tree.map_structure(lambda x: tuple(np.shape(x)), input_data)
        computed = layer.compute_output_shape(shapes)
        actual = [tuple(x.shape) for x in eager]
        assert _shape_list(computed) == actual, f"{name}.compute_output_shape gives {computed}, the outputs {actual}"


def _shape_list(computed):
    """`compute_output_shape`'s answer (a shape, or a list / dict of them) as tuples in the outputs' flat order."""
    if isinstance(computed, dict):
        return [shape for key in sorted(computed) for shape in _shape_list(computed[key])]
    if all(d is None or isinstance(d, int) for d in computed):
        return [tuple(computed)]
    return [shape for part in computed for shape in _shape_list(part)]


def _append(x, steps, value):
    """`x` `(batch, steps, ...)` with `steps` positions of `value` appended on axis 1 (rank 1 as it is)."""
    return _pad_to(x, np.shape(x)[1] + steps, value) if np.ndim(x) >= 2 else np.asarray(x)


def _pad_to(x, width, value):
    """`x` `(batch, steps, ...)` with `value` appended on axis 1 up to `width` steps (arrays of rank 1 as they are)."""
    x = np.asarray(x)
    if x.ndim < 2 or x.shape[1] >= width:
        return x
    return np.concatenate([x, np.full((x.shape[0], width - x.shape[1]) + x.shape[2:], value, x.dtype)], axis=1)


def _batch(first, second, first_mask, second_mask, pad_value):
    """`first`'s rows then `second`'s, padded to the same width; and their masks alike."""
    import keras

    widths = [x.shape[1] for x in keras.tree.flatten([first, second]) if np.ndim(x) >= 2]
    width = max(widths, default=0)
    if len(set(widths)) > 1 and pad_value is None:
        raise ValueError("batch_mates of another width need a pad_value")

    def join(a, b, value):
        return np.concatenate([_pad_to(a, width, value), _pad_to(b, width, value)], axis=0)

    together = keras.tree.map_structure(lambda a, b: join(a, b, pad_value), first, second)
    if second_mask is None:
        return together, None
    if first_mask is None:
        raise ValueError("batch_mates need batch_mates_mask when the test gives a mask")
    return together, join(first_mask, second_mask, False)


def _check_real_positions(alone, together, first_row, atol, zeros_at_padding, what):
    """Each output of `alone` equals rows `first_row:` of `together`, cut to its extent; the rest is zeros."""
    for k, (a, t) in enumerate(zip(_flat(alone), _flat(together))):
        rows = t[first_row : first_row + len(a)]
        assert rows.shape[0] == a.shape[0] and rows.ndim == a.ndim, f"output {k}: {a.shape} vs {t.shape}"
        real = rows[(slice(None),) + tuple(slice(0, n) for n in a.shape[1:])]
        message = f"output {k}, {what}"
        if a.dtype.kind == "f":
            np.testing.assert_allclose(real, a, atol=atol, rtol=0, err_msg=message)
        else:
            np.testing.assert_array_equal(real, a, err_msg=message)
        if zeros_at_padding and a.ndim >= 2 and rows.shape[1] > a.shape[1]:
            assert not rows[:, a.shape[1] :].any(), f"{message}: non-zero past the real positions"


# ------------------------------------------------------------------------------------------------ another process


class FreshProcess:
    """Another Python process that reloads `.keras` files with `elmo_tf.load_model` and compares the outputs.

    One process serves every check of a test session (a TensorFlow start costs seconds here): it starts importing
    TensorFlow and Keras as soon as `start()` is called, but no elmo_tf class, so the first file it loads finds them
    registered only through `elmo_tf.load_model`, as the README says; later files share that process's registry.
    `check()` saves a model and its outputs under `directory`, sends the file's name and waits for the answer, so a
    failure belongs to the test that made the file. A process that does not answer in time is ended, and the next
    check starts another.
    """

    def __init__(self, directory):
        self.directory = Path(directory)
        self._process = None
        self._answers = queue.Queue()
        self._count = 0

    def start(self):
        if self._process is not None:
            return
        self._answers = queue.Queue()
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), str(TESTS_DIR), env.get("PYTHONPATH")) if p)
        self._stderr = open(self.directory / "stderr.txt", "a")  # closed in close()
        self._process = subprocess.Popen(
            [sys.executable, "-c", "import layer_testlib; layer_testlib.serve_reloads()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=env,
            cwd=self.directory,
        )
        threading.Thread(target=self._read_answers, args=(self._process, self._answers), daemon=True).start()

    @staticmethod
    def _read_answers(process, answers):
        for line in process.stdout:
            answers.put(json.loads(line))
        answers.put(None)  # the process ended

    def check(self, model, inputs, layer_name, safe_mode=True, atol=1e-6):
        """Asserts that `model`, saved to `.keras` and reloaded there, gives `model(inputs)` within `atol` and the
        same config for its layer `layer_name`."""
        self.ask(self.save(model, inputs, layer_name, safe_mode=safe_mode, atol=atol))

    def save(self, model, inputs, layer_name, safe_mode=True, atol=1e-6):
        """Writes `model.keras` and `data.npz` (inputs `in<k>`, outputs `out<k>`) to a new directory; returns the
        request for `ask`."""
        self._count += 1
        directory = self.directory / f"model_{self._count}"
        directory.mkdir()
        model.save(directory / "model.keras")
        outputs = _flat(model([_tensor(x) for x in inputs] if len(inputs) > 1 else _tensor(inputs[0])))
        np.savez(
            directory / "data.npz",
            **{f"in{k}": np.asarray(x) for k, x in enumerate(inputs)},
            **{f"out{k}": y for k, y in enumerate(outputs)},
        )
        config = model.get_layer(layer_name).get_config()
        return dict(directory=str(directory), layer=layer_name, config=config, safe_mode=safe_mode, atol=atol)

    def ask(self, request):
        """Sends `request` to the other process and asserts its answer says the reload matched."""
        self.start()
        try:
            self._process.stdin.write(json.dumps(request) + "\n")
            self._process.stdin.flush()
            answer = self._answers.get(timeout=RELOAD_TIMEOUT_S)
        except BrokenPipeError:
            answer = None
        except queue.Empty:
            self.close(wait_s=0)
            answer = {"error": f"no answer within {RELOAD_TIMEOUT_S} s"}
        if answer is None:
            answer = {"error": f"the process ended (status {self._process.wait()}): {self._stderr_tail()}"}
            self.close()
        name = Path(request["directory"]).name
        assert answer["error"] is None, f"{name} reloaded in another process: {answer['error']}"

    def _stderr_tail(self):
        self._stderr.flush()
        return (self.directory / "stderr.txt").read_text()[-2000:]

    def close(self, wait_s=5):
        """Ends the process: closes its input, and kills it after `wait_s` seconds (TensorFlow's exit can take a
        minute on busy cores, and the process has nothing left to write)."""
        if self._process is None:
            return
        try:
            self._process.stdin.close()
        except BrokenPipeError:
            pass
        try:
            self._process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._stderr.close()
        self._process = None


def serve_reloads():
    """The other process of `FreshProcess`: one JSON request per stdin line, one JSON answer per stdout line."""
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever else writes to stdout goes to stderr
    import keras  # TensorFlow's start overlaps the tests' own work

    import elmo_tf

    fresh = True
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if fresh:
                registered = [k for k in keras.saving.get_custom_objects() if k.startswith("elmo_tf>")]
                assert not registered, f"elmo_tf classes registered before elmo_tf.load_model: {registered}"
                fresh = False
            _reload_and_compare(elmo_tf, **request)
            answer = {"error": None}
        except Exception as e:  # reported to the test that asked
            answer = {"error": f"{type(e).__name__}: {e}"}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


def _reload_and_compare(elmo_tf, directory, layer, config, safe_mode, atol):
    model = elmo_tf.load_model(os.path.join(directory, "model.keras"), safe_mode=safe_mode)
    data = np.load(os.path.join(directory, "data.npz"))
    inputs = [_tensor(data[f"in{k}"]) for k in range(sum(name.startswith("in") for name in data.files))]
    outputs = _flat(model(inputs if len(inputs) > 1 else inputs[0]))
    assert len(outputs) == sum(name.startswith("out") for name in data.files), "another number of outputs"
    for k, actual in enumerate(outputs):
        expected = data[f"out{k}"]
        if expected.dtype.kind == "f":
            np.testing.assert_allclose(actual, expected, atol=atol, rtol=0, err_msg=f"output {k}")
        else:
            np.testing.assert_array_equal(actual, expected, err_msg=f"output {k}")
    reloaded = model.get_layer(layer).get_config()
    assert _json(reloaded) == _json(config), f"the reloaded layer's config differs: {reloaded} vs {config}"


def rewrite_keras_weights(path, out, edit):
    """Copies the `.keras` file `path` to `out` (a `Path`) with its weights file changed by `edit(weights, names)`
    (`weights`: the `model.weights.h5` inside, an `h5py.File` open for writing; `names`: the paths of its groups and
    datasets): how a test writes a file as older code wrote it, to check that it still loads."""
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(out, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename == "model.weights.h5":
                weights = out.parent / f"{out.name}.weights.h5"
                weights.write_bytes(data)
                with h5py.File(weights, "r+") as f:
                    names = []
                    f.visit(names.append)
                    edit(f, names)
                data = weights.read_bytes()
            dst.writestr(item, data)
