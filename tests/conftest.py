"""Shared fixtures for the elmo_tf tests: tiny seeded models, char-id helpers, NumPy references, the layer contract.

Test directories carry no `__init__.py`: every test module has a unique basename (rootdir-relative
imports), so pytest's default import mode finds them without package names.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import functools  # noqa: E402
from pathlib import Path  # noqa: E402

import forked  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from layer_testlib import FreshProcess, run_layer_test  # noqa: E402
from tiny_models import TINY, randomize_weights  # noqa: E402

from elmo_tf.config import BiLMConfig  # noqa: E402
from elmo_tf.models import ELMo  # noqa: E402
from elmo_tf.preprocessing.chars import MAX_CHARS, tokens_to_char_ids_numpy  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = REPO_ROOT.parent / "shared" / "data"
FIXTURES_DIR = DATA_DIR / "elmo_fixtures"


@pytest.fixture(autouse=True)
def _seed():
    keras.utils.set_random_seed(1234)


@pytest.fixture
def fixtures_dir():
    """Weights and outputs recorded from the original implementations (../shared/data/elmo_fixtures)."""
    if not FIXTURES_DIR.is_dir():
        pytest.skip(f"reference fixtures not found at {FIXTURES_DIR} (shared data is not checked out)")
    return FIXTURES_DIR


@pytest.fixture
def tiny_config():
    return BiLMConfig(**TINY)


@pytest.fixture(scope="session")
def fresh_process(tmp_path_factory):
    """The session's other Python process reloading `.keras` files (layer_testlib.FreshProcess)."""
    process = FreshProcess(tmp_path_factory.mktemp("fresh_process"))
    process.start()
    yield process
    process.close()


@pytest.fixture(scope="session", autouse=True)
def _fresh_process_early(request):
    """Starts `fresh_process` with the session's first test when a selected test uses it: TensorFlow's start in
    the other process then overlaps the tests before it."""
    if any("fresh_process" in item.fixturenames for item in request.session.items):
        request.getfixturevalue("fresh_process")


@pytest.fixture(scope="session", autouse=True)
def _fork_server():
    """Starts the worker's fork server (`forked`) with the session, so that its imports overlap the first tests."""
    forked.start()


@pytest.fixture
def layer_contract(fresh_process):
    """`layer_contract(cls, init_kwargs, input_data, **options) -> (layer, outputs)`: the shared layer contract
    (layer_testlib.run_layer_test: config, shapes, masking, padding, `.keras` reload in another process)."""
    return functools.partial(run_layer_test, fresh_process=fresh_process)


@pytest.fixture
def randomize():
    return randomize_weights


@pytest.fixture
def make_elmo():
    """`make(config=None, seed=0, randomize=True, **elmo_kwargs)` -> a tiny ELMo with seeded random weights."""

    def make(config=None, seed=0, randomize=True, **kwargs):
        keras.utils.set_random_seed(seed)
        model = ELMo(config if config is not None else BiLMConfig(**TINY), **kwargs)
        if randomize:
            randomize_weights(model, seed)
        return model

    return make


@pytest.fixture
def tiny_elmo(make_elmo):
    return make_elmo()


def char_ids(sentences, num_tokens=None):
    """Token lists -> left-aligned int32 char ids `(batch, num_tokens, 50)`, zero rows for padding."""
    num_tokens = max([len(s) for s in sentences] + [0]) if num_tokens is None else num_tokens
    out = np.zeros([len(sentences), num_tokens, MAX_CHARS], np.int32)
    for k, sentence in enumerate(sentences):
        if sentence:
            out[k, : len(sentence)] = tokens_to_char_ids_numpy(sentence)
    return out


@pytest.fixture
def to_char_ids():
    return char_ids


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def lstm_reference(
    x, lengths, w_0, bias, w_p, cell_clip=None, proj_clip=None, go_backwards=False, initial_c=None, initial_h=None
):
    """Step-by-step float64 TF1 `LSTMCell(num_proj=P, forget_bias=1.0)` over each row's real tokens.

    `w_0` is the TF1 kernel `(input + P, 4 * units)` (input rows first), gates i, j, f, o.
    Backward rows are read from their last real token to their first; outputs stay in forward order.
    Returns outputs `(batch, time, P)` (zeros at padding) and the final `c`, `h` per row.
    """
    x = np.asarray(x, np.float64)
    w_0, bias, w_p = (np.asarray(a, np.float64) for a in (w_0, bias, w_p))
    batch, steps, _ = x.shape
    units, proj = w_p.shape
    out = np.zeros([batch, steps, proj])
    final_c = np.zeros([batch, units]) if initial_c is None else np.array(initial_c, np.float64)
    final_h = np.zeros([batch, proj]) if initial_h is None else np.array(initial_h, np.float64)
    for b in range(batch):
        c, m = final_c[b].copy(), final_h[b].copy()
        order = range(lengths[b] - 1, -1, -1) if go_backwards else range(lengths[b])
        for t in order:
            z = np.concatenate([x[b, t], m]) @ w_0 + bias
            i, j, f, o = np.split(z, 4)
            c = _sigmoid(f + 1.0) * c + _sigmoid(i) * np.tanh(j)
            if cell_clip:
                c = np.clip(c, -cell_clip, cell_clip)
            m = (_sigmoid(o) * np.tanh(c)) @ w_p
            if proj_clip:
                m = np.clip(m, -proj_clip, proj_clip)
            out[b, t] = m
        final_c[b], final_h[b] = c, m
    return out, final_c, final_h


def lstm_weights(lstm):
    """(W_0, B, W_P_0) of a `ProjectedLSTM` in the TF1 layout, as float64 arrays."""
    w_0 = np.concatenate([lstm.input_kernel.numpy().T, lstm.recurrent_kernel.numpy().T], axis=0)  # stored transposed
    return (
        w_0.astype(np.float64),
        lstm.bias.numpy().astype(np.float64),
        lstm.projection_kernel.numpy().T.astype(np.float64),
    )


@pytest.fixture
def numpy_lstm():
    """`numpy_lstm(x, lengths, lstm_layer, go_backwards=..., initial_c=..., initial_h=...)` with clips
    taken from the layer unless given."""

    def run(x, lengths, lstm, go_backwards=None, initial_c=None, initial_h=None, cell_clip="layer", proj_clip="layer"):
        w_0, bias, w_p = lstm_weights(lstm)
        return lstm_reference(
            x,
            lengths,
            w_0,
            bias,
            w_p,
            cell_clip=lstm.cell_clip if cell_clip == "layer" else cell_clip,
            proj_clip=lstm.proj_clip if proj_clip == "layer" else proj_clip,
            go_backwards=lstm.go_backwards if go_backwards is None else go_backwards,
            initial_c=initial_c,
            initial_h=initial_h,
        )

    return run


def load_script(path):
    """A command-line script (training/*.py, export/*.py) imported as a module, for calling its `main`."""
    import importlib.util

    path = Path(path)
    spec = importlib.util.spec_from_file_location(f"script_{path.parent.name}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def run_script(capsys):
    """`run_script(path, argv) -> (exit code, stdout, stderr)`: the script's `main` under `elmo_tf.cli.run`, in
    this process (argparse's own errors arrive as SystemExit, as from the command line)."""
    from elmo_tf.cli import run

    def call(path, argv):
        module = load_script(path)
        try:
            code = run(module.main, [str(a) for a in argv], prog=Path(path).name)
        except SystemExit as e:
            code = e.code
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return call
