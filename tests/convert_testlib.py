"""Sources for the converter tests, written the way the original tools write them: TF1 checkpoints through
`tf.compat.v1.train.Saver` in a TF1 graph and session, under bilm-tf's variable names.

The name mapping here goes the other way from the converter's (a released weight file -> the training graph's and
the Hub module's variable names) and is written out from bilm-tf's code: the training graph
(`bilm/training.py::LanguageModel`, scope `lm`, `tf.nn.static_rnn` under `RNN_{d}` with a MultiRNNCell of
LSTMCells) and the inference graph TF Hub's module was built from (`bilm/model.py`, scope `bilm`, `dynamic_rnn` under
`RNN_{d}/RNN/MultiRNNCell/Cell{l}`).
"""

import json
import os
from pathlib import Path

import h5py
import numpy as np

FIXTURES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "elmo_fixtures" / "bilm_tf" / "model"

# the training graph's LSTM variable of each weight-file name, recorded from bilm-tf's graph (layer 1, backward)
RECORDED = {
    "RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/W_0": "lm/RNN_1/rnn/multi_rnn_cell/cell_1/lstm_cell/kernel",
    "RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/B": "lm/RNN_1/rnn/multi_rnn_cell/cell_1/lstm_cell/bias",
    "RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/W_P_0": "lm/RNN_1/rnn/multi_rnn_cell/cell_1/lstm_cell/projection/kernel",
}
_LSTM_VAR = {"W_0": "kernel", "B": "bias", "W_P_0": "projection/kernel"}


def read_hdf5(path):
    """{dataset name: array} of every dataset in `path`."""
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[...]) if isinstance(obj, h5py.Dataset) else None)
    return out


def training_name(hdf5_name):
    """bilm-tf training graph variable of a weight-file dataset (dump_weights' renaming, undone)."""
    if hdf5_name.startswith("RNN_"):
        d, _rnn, _multi, cell, _lstm, var = hdf5_name.split("/")
        layer = int(cell[len("Cell") :])
        return f"lm/{d}/rnn/multi_rnn_cell/cell_{layer}/lstm_cell/{_LSTM_VAR[var]}"
    return f"lm/{hdf5_name}"


def hub_name(hdf5_name):
    """TF Hub google/elmo module variable of a weight-file dataset."""
    if hdf5_name.startswith("RNN_"):
        d, _rnn, _multi, cell, _lstm, var = hdf5_name.split("/")
        return f"bilm/{d}/RNN/MultiRNNCell/{cell}/rnn/lstm_cell/{_LSTM_VAR[var]}"
    return f"bilm/{hdf5_name}"


def save_tf1_checkpoint(prefix, variables, step=None, write_state=True):
    """Writes `variables` ({name: array}) with a TF1 Saver (V2 format) in a TF1 graph; returns the saved prefix."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        var_list = {
            name: tf.compat.v1.get_variable(name, initializer=tf.constant(value), dtype=tf.constant(value).dtype)
            for name, value in variables.items()
        }
        saver = tf.compat.v1.train.Saver(var_list=var_list, max_to_keep=10)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            return saver.save(sess, prefix, global_step=step, write_meta_graph=False, write_state=write_state)


def training_variables(weights, softmax, seed=0):
    """bilm-tf training checkpoint contents: the biLM weights under training names, the softmax, an Adagrad slot
    per variable, `global_step` and `train_perplexity`."""
    rng = np.random.default_rng(seed)
    variables = {training_name(name): array for name, array in weights.items()}
    variables["lm/softmax/W"], variables["lm/softmax/b"] = softmax
    for name in list(variables):
        variables[f"{name}/Adagrad"] = (1.0 + rng.random(variables[name].shape)).astype(np.float32)
    variables["global_step"] = np.int64(1250)
    variables["train_perplexity"] = np.float32(123.5)
    return variables


def training_options(vocab_size):
    """options.json as bilm-tf's `train` writes it beside the checkpoint: the fixture's architecture with the
    training values (n_characters 261) and keys."""
    options = json.loads((FIXTURES / "options.json").read_text())
    options["char_cnn"]["n_characters"] = 261
    options.update(bidirectional=True, n_tokens_vocab=vocab_size, batch_size=4, unroll_steps=5, dropout=0.1)
    options.update(n_epochs=1, n_train_tokens=1000, n_negative_samples_batch=4, all_clip_norm_val=10.0)
    return options


def write_training_dir(directory, weights, softmax, steps=(1250,), seed=0):
    """A bilm-tf training dir: options.json and one checkpoint per step (the variables scaled by the step's index,
    so steps differ; the last step holds `weights` as they are). Returns the prefixes."""
    os.makedirs(directory, exist_ok=True)
    (Path(directory) / "options.json").write_text(json.dumps(training_options(len(softmax[1]))))
    prefixes = []
    for k, step in enumerate(steps):
        scale = np.float32(len(steps) - k)
        scaled = {name: array * scale for name, array in weights.items()}
        prefixes.append(
            save_tf1_checkpoint(os.path.join(directory, "model.ckpt"), training_variables(scaled, softmax, seed), step)
        )
    return prefixes


def random_softmax(vocab_size, projection_dim, seed=0):
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((vocab_size, projection_dim)).astype(np.float32),
        rng.standard_normal(vocab_size).astype(np.float32),
    )


def fixture_training_dir(directory):
    """A bilm-tf training dir at `directory` holding bilm-tf's fixture weights (lm_weights.hdf5) and an 11-word
    softmax; skips the test when the shared fixtures are not there."""
    import pytest

    if not (FIXTURES / "lm_weights.hdf5").is_file():
        pytest.skip(f"bilm-tf fixtures not found at {FIXTURES}")
    write_training_dir(directory, read_hdf5(FIXTURES / "lm_weights.hdf5"), random_softmax(11, 16))
    return Path(directory)


EFML = Path(__file__).resolve().parent / "fixtures" / "efml"  # the small ELMoForManyLangs models (tests/convert)


def converted_efml(directory, variant="word"):
    """`tests/fixtures/efml/<variant>/model` (`word`: char CNN + word embedding, `noword`: char CNN alone) converted
    into `directory` with `elmo-tf convert --from elmoformanylangs`'s library call; returns `directory`."""
    from elmo_tf.convert import convert

    convert("elmoformanylangs", str(EFML / variant / "model"), str(directory))
    return Path(directory)


def converted_checkpoint(directory):
    """bilm-tf's fixture weights and an 11-word softmax written as a TF1 training checkpoint (`fixture_training_dir`)
    and converted into `directory/out` (`--from bilm-tf-checkpoint`); returns that dir (options.json,
    weights.hdf5, softmax.hdf5)."""
    from elmo_tf.convert import convert

    source = fixture_training_dir(Path(directory) / "run")
    convert("bilm-tf-checkpoint", str(source), str(Path(directory) / "out"))
    return Path(directory) / "out"


MIX_WEIGHTS = np.array([0.25, -0.5, 1.5], np.float32)  # the module's aggregation/weights and scaling
SCALING = np.float32(0.75)


def write_module(directory, weights, extra=None):
    """A TF1 Hub module dir: the biLM under `bilm/` (char_embed with the zero padding row 0, 262 rows), the mix
    under `aggregation/`, and the stateful graph's state buffers, which are not weights."""
    variables = {hub_name(name): array for name, array in weights.items()}
    variables["bilm/char_embed"] = np.concatenate(
        [np.zeros((1, weights["char_embed"].shape[1]), np.float32), weights["char_embed"]]
    )
    variables["aggregation/weights"], variables["aggregation/scaling"] = MIX_WEIGHTS, SCALING
    variables["bilm/Variable"] = np.zeros((128, 64), np.float32)
    variables["bilm/Variable_1"] = np.zeros((128, 16), np.float32)
    variables.update(extra or {})
    os.makedirs(os.path.join(directory, "variables"))
    with open(os.path.join(directory, "tfhub_module.pb"), "wb") as f:
        f.write(b"\x08\x03")  # a ModuleDef proto (format 3); not read by the converter
    save_tf1_checkpoint(os.path.join(directory, "variables", "variables"), variables, write_state=False)
