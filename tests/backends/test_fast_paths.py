"""The fast paths behind the door `elmo_tf.layers.backends` on the active Keras backend (JAX's and PyTorch's:
elmo_tf/layers/backends/jax_*.py, torch_*.py; TensorFlow's where the comparison applies) against the layers' own
`keras.ops` paths: the same outputs, final states and gradients to float32 rounding (1e-5 of their scale), on masks
with empty rows, rows with holes, segments and initial states; the char CNN's distinct tokens against every row at
every position, eagerly and inside `jax.jit`; and that the fast paths are the ones that run (a `keras.ops` path
replaced by one that fails), while the calls they do not handle go to the `keras.ops` path.
"""

import numpy as np
import pytest
from backend_testlib import (
    SMALL_BILM,
    backend,
    loss_and_gradients,
    make_small_bilm,
    slow_off_tensorflow,
    small_bilm_case,
    to_numpy,
)
from tiny_models import TINY, randomize_weights

from elmo_tf.config import BiLMConfig
from elmo_tf.layers import BiLM, CharCNN, backends, projected_lstm
from elmo_tf.models import ELMo
from elmo_tf.preprocessing.char_rows import BYTE_MAPPING, sentences_to_char_ids

ATOL = 1e-5
FAST = backend() in ("jax", "torch")  # where this file's spies apply (TensorFlow has its own tests of its paths)
PROJ = SMALL_BILM["projection_dim"]


def _tensor(x):
    import keras

    return keras.ops.convert_to_tensor(x)


def _masks():
    """Masks `(batch, time)` of the recurrence's cases, by name."""
    steps = 7
    ragged = np.arange(steps)[None, :] < np.array([7, 3, 0, 5, 1])[:, None]  # an empty row, a full one
    holes = ragged.copy()
    holes[0, 2] = holes[3, 0] = False  # not left-aligned: the state is carried over the holes
    return {
        "ragged": ragged,
        "holes": holes,
        "all-empty": np.zeros((2, steps), bool),
        "all-full": np.ones((3, steps), bool),
    }


def _initial_state(batch, seed):
    rng = np.random.default_rng(seed)
    sizes = [SMALL_BILM["units"], PROJ] * 2 * SMALL_BILM["num_layers"]
    return [rng.normal(0.0, 0.5, size=(batch, n)).astype(np.float32) for n in sizes]


def _run(bilm, x, mask, initial_state, autograd, **kwargs):
    """The BiLM's outputs and final states as NumPy (PyTorch: with autograd recording, or under `torch.no_grad()`)."""
    state = [_tensor(s) for s in initial_state]
    if backend() == "torch" and not autograd:
        import torch

        with torch.no_grad():
            outputs, final = bilm(_tensor(x), mask=_tensor(mask), initial_state=state, return_state=True, **kwargs)
    else:
        outputs, final = bilm(_tensor(x), mask=_tensor(mask), initial_state=state, return_state=True, **kwargs)
    return [to_numpy(o) for o in outputs + final]


def _assert_close(got, want, what):
    assert len(got) == len(want)
    for k, (a, b) in enumerate(zip(got, want)):
        scale = max(1.0, float(np.abs(b).max(initial=0.0)))
        np.testing.assert_allclose(a, b, atol=ATOL * scale, rtol=0, err_msg=f"{what} {k}")


@pytest.mark.parametrize("autograd", [False, True], ids=["inference", "autograd"])
@pytest.mark.parametrize(  # off TensorFlow each case compiles for 10-20 s: "ragged" in make test, the rest slow
    "case", [c if c == "ragged" else pytest.param(c, marks=slow_off_tensorflow()) for c in sorted(_masks())]
)
def test_recurrence_equals_the_keras_ops_loop(case, autograd):
    """`implementation="auto"` (JAX's `lax.scan`, PyTorch's packed or masked loop) gives the outputs and final states
    of `implementation="ops"` within 1e-5, from random initial states, on every mask: empty rows and all-empty
    batches keep their initial state with zero outputs, holes carry the state."""
    mask = _masks()[case]
    x = np.random.default_rng(3).normal(size=(*mask.shape, PROJ)).astype(np.float32)
    state = _initial_state(mask.shape[0], seed=4)
    want = _run(make_small_bilm(implementation="ops"), x, mask, state, autograd)
    got = _run(make_small_bilm(implementation="auto"), x, mask, state, autograd)
    _assert_close(got, want, case)
    assert max(float(np.abs(w).max(initial=0.0)) for w in want) > 0.1  # not a comparison of zeros
    if case == "all-empty":  # the final states are the initial ones
        for k, s in enumerate(state):
            np.testing.assert_array_equal(got[SMALL_BILM["num_layers"] + k], s)


def test_segments_equal_the_keras_ops_loop():
    """Packed rows (`segment_starts`: each segment from the zero state) on the fast loop give the `keras.ops` loop's
    outputs."""
    mask = _masks()["ragged"]
    starts = np.zeros_like(mask)
    starts[:, 0] = True
    starts[0, 3] = starts[3, 2] = True
    x = np.random.default_rng(5).normal(size=(*mask.shape, PROJ)).astype(np.float32)
    state = _initial_state(mask.shape[0], seed=6)
    want = _run(make_small_bilm(implementation="ops"), x, mask, state, False, segment_starts=_tensor(starts))
    got = _run(make_small_bilm(implementation="auto"), x, mask, state, False, segment_starts=_tensor(starts))
    _assert_close(got, want, "segments")


@pytest.mark.parametrize("holes", [False, pytest.param(True, marks=slow_off_tensorflow())], ids=["ragged", "holes"])
def test_gradients_equal_the_keras_ops_loops(holes):
    """The backend's automatic gradient through the fast loop (`jax.grad` through `lax.scan` and `lax.cond`, PyTorch's
    autograd through its loop) equals the one through the `keras.ops` loop, for the inputs and every weight."""
    x, mask, loss_weights = small_bilm_case()
    if holes:
        mask = mask.copy()
        mask[0, 2] = False
    want = loss_and_gradients(make_small_bilm(implementation="ops"), x, mask, loss_weights)
    got = loss_and_gradients(make_small_bilm(implementation="auto"), x, mask, loss_weights)
    _assert_close(got, want, "loss/gradient")
    assert all(float(np.abs(g).max()) > 1e-2 for g in want[1:])


@pytest.fixture
def ops_loop_calls(monkeypatch):
    """Counts the calls of the `keras.ops` loop (`run_cells`'s `ops_lstm_scan`)."""
    calls = []
    original = projected_lstm.ops_lstm_scan

    def counted(*args, **kwargs):
        calls.append(kwargs.get("matmul_dtype"))
        return original(*args, **kwargs)

    monkeypatch.setattr(projected_lstm, "ops_lstm_scan", counted)
    return calls


@pytest.mark.skipif(not FAST, reason="JAX's and PyTorch's paths")
def test_the_fast_loop_runs_and_declines_what_it_does_not_handle(ops_loop_calls):
    """ "auto" runs the backend's loop (no `keras.ops` loop call, in inference and in training); "ops" and a training
    call whose matmuls are bfloat16 run the `keras.ops` loop, once per layer."""
    x, mask, _ = small_bilm_case()
    make_small_bilm()(x, mask=mask)
    make_small_bilm()(x, mask=mask, training=True)
    assert ops_loop_calls == []
    make_small_bilm(implementation="ops")(x, mask=mask)
    make_small_bilm(matmul_dtype="bfloat16")(x, mask=mask, training=True)
    layers = SMALL_BILM["num_layers"]
    assert ops_loop_calls == [None] * layers + ["bfloat16"] * layers


@pytest.mark.parametrize(
    "implementation, gate_chunk, matmul_dtype, dtype",
    [
        ("ops", None, None, "float32"),
        ("auto", 4, None, "float32"),
        ("auto", None, "bfloat16", "float32"),
        ("auto", None, None, "bfloat16"),
    ],
)
def test_plain_float32_loop_declines(implementation, gate_chunk, matmul_dtype, dtype):
    """The door's rule for JAX's and PyTorch's loops: only "auto", no `gate_chunk`, float32 matmuls and operands."""
    import keras

    def args(dtype):
        kernels = [[keras.ops.zeros((4, 3), "float32")]] * 4
        states = [[keras.ops.zeros((2, 1), "float32")]] * 2
        return ([keras.ops.zeros((1, 2, 3), dtype)], keras.ops.ones((1, 2), "bool"), *kernels, *states, None, None)

    assert backends.plain_float32_loop(args("float32"), "auto", None, None) is None
    assert backends.plain_float32_loop(args("float32"), "auto", None, "float32") is None
    with pytest.raises(NotImplementedError):
        backends.plain_float32_loop(args(dtype), implementation, gate_chunk, matmul_dtype)


@pytest.mark.skipif(backend() != "torch", reason="PyTorch's loop writes in place")
def test_the_in_place_loop_leaves_its_inputs_alone():
    """PyTorch's loop without autograd updates its state in place: the caller's initial states and inputs keep their
    values."""
    import torch

    mask = _masks()["ragged"]
    x = np.random.default_rng(7).normal(size=(*mask.shape, PROJ)).astype(np.float32)
    state = [torch.tensor(s) for s in _initial_state(mask.shape[0], seed=8)]
    before = [s.clone() for s in state]
    x_tensor = torch.tensor(x)
    with torch.no_grad():
        make_small_bilm()(x_tensor, mask=torch.tensor(mask), initial_state=state)
    for a, b in zip(state, before):
        assert torch.equal(a, b)
    assert torch.equal(x_tensor, torch.tensor(x))


@pytest.mark.skipif(backend() != "torch", reason="PyTorch's oneDNN copies of the kernels")
@pytest.mark.parametrize("case", ["ragged", "holes"])  # the packed loop (left-aligned rows), the masked one
def test_the_oneDNN_copies_of_the_kernels_follow_the_weights(case):
    """Without autograd PyTorch's loop multiplies each step by oneDNN's reordered copies of its kernels (where this
    PyTorch has oneDNN's linear), made once per kernel: weights written after a call (`set_weights`, Keras's
    `assign`) give the new weights' outputs, equal to the `keras.ops` loop's, not the old copies'."""
    from elmo_tf.layers.backends import torch_recurrence

    mask = _masks()[case]
    x = np.random.default_rng(10).normal(size=(*mask.shape, PROJ)).astype(np.float32)
    state = _initial_state(mask.shape[0], seed=11)
    fast, ops_loop = make_small_bilm(implementation="auto"), make_small_bilm(implementation="ops")
    before = _run(fast, x, mask, state, autograd=False)
    _assert_close(before, _run(ops_loop, x, mask, state, autograd=False), f"{case}, first weights")
    if torch_recurrence._ONEDNN_LINEAR:  # a copy of each recurrent and projection kernel, made by the first call
        copied = [w for w in fast.weights if w.value in torch_recurrence._REORDERED]
        assert len(copied) == 2 * 2 * SMALL_BILM["num_layers"], [w.path for w in copied]
    rng = np.random.default_rng(12)
    weights = [rng.normal(0.0, 0.4, size=tuple(w.shape)).astype(np.float32) for w in fast.weights]
    fast.set_weights(weights)
    ops_loop.set_weights(weights)
    after = _run(fast, x, mask, state, autograd=False)
    _assert_close(after, _run(ops_loop, x, mask, state, autograd=False), f"{case}, weights written")
    assert float(np.abs(after[0] - before[0]).max()) > 0.1


# ------------------------------------------------------------------------------------------------------ char CNN

LONG = "z" * 70  # longer than max_chars - widest filter: no cut of the char positions
SENTENCES = [["Hello", "world", "!", "Hello"], ["naïve", "日本語", "!"], [LONG, "a"], []]


def _char_cnn(word_vocab_size=0):
    cnn = CharCNN(
        filters=((1, 4), (2, 8), (3, 5)),
        num_highway=1,
        projection_dim=6,
        char_embedding_dim=3,
        word_vocab_size=word_vocab_size,
        word_embedding_dim=2 if word_vocab_size else 0,
    )
    cnn.build((None, None, cnn.input_width))
    randomize_weights(cnn, seed=9, scale=0.5)
    return cnn


def _ids(sentences, word_vocab_size=0):
    ids = sentences_to_char_ids(BYTE_MAPPING, sentences)
    if word_vocab_size:
        words = np.random.default_rng(10).integers(1, word_vocab_size, size=ids.shape[:2])
        ids = np.concatenate([ids, (words * ids.any(axis=-1))[:, :, None].astype(np.int32)], axis=-1)
    return ids


def _every_row(cnn, ids):
    return to_numpy(cnn._encode_all(cnn._check_ids(ids, None)))


@pytest.mark.parametrize(
    "sentences", [pytest.param(SENTENCES, marks=slow_off_tensorflow()), SENTENCES[:2]], ids=["long-token", "cut"]
)
@pytest.mark.parametrize(
    "word_vocab_size", [0, pytest.param(5, marks=slow_off_tensorflow())], ids=["chars", "word-ids"]
)
def test_char_cnn_paths_equal_every_row(sentences, word_vocab_size):
    """`encode_distinct`, `call` and `encode_tokens` (distinct rows, positions cut to the longest token where no
    token is too long and no word id follows) give the vectors of every row at every position, zeros for padding
    (`encode_tokens`: its real rows)."""
    cnn = _char_cnn(word_vocab_size)
    ids = _ids(sentences, word_vocab_size)
    want = _every_row(cnn, ids)
    assert np.abs(want).max() > 0.1 and not want[~ids.any(axis=-1)].any()
    for got in (cnn.encode_distinct(ids), cnn(ids)):
        np.testing.assert_allclose(to_numpy(got).reshape(want.shape), want, atol=ATOL, rtol=0)
    # encode_tokens leaves all-zero rows as they are (TensorFlow's are not zeros): its real rows
    real = ids.any(axis=-1)
    got = to_numpy(cnn.encode_tokens(ids.reshape(-1, ids.shape[-1]))).reshape(want.shape)
    np.testing.assert_allclose(got[real], want[real], atol=ATOL, rtol=0)


def test_char_cnn_takes_an_empty_batch():
    cnn = _char_cnn()
    assert to_numpy(cnn.encode_distinct(np.zeros((0, 3, 50), np.int32))).shape == (0, 3, 6)
    assert to_numpy(cnn.encode_tokens(np.zeros((0, 50), np.int32))).shape == (0, 6)


@pytest.mark.skipif(backend() != "jax", reason="jax.jit")
def test_char_cnn_in_jax_jit_encodes_distinct_rows(monkeypatch):
    """Inside `jax.jit` (traced ids) the char CNN encodes the distinct rows in chunks, skipping those past the last
    one: every row's vectors, and the all-rows path (`_encode_all`) is not taken."""
    import jax

    from elmo_tf.layers.backends import jax_char_cnn

    monkeypatch.setattr(jax_char_cnn, "CHUNK_ROWS", 4)  # several chunks, some skipped
    cnn = _char_cnn()
    ids = _ids(SENTENCES * 3)
    want = _every_row(cnn, ids)
    encoded = []
    original = cnn._encode_rows
    monkeypatch.setattr(cnn, "_encode_rows", lambda rows: encoded.append(rows.shape[0]) or original(rows))
    monkeypatch.setattr(cnn, "_encode_all", lambda ids: pytest.fail("every row encoded"))
    trainable = [v.value for v in cnn.trainable_variables]
    frozen = [v.value for v in cnn.non_trainable_variables]
    got = jax.jit(lambda t, f, ids: cnn.stateless_call(t, f, ids)[0])(trainable, frozen, ids)
    np.testing.assert_allclose(np.asarray(got), want, atol=ATOL, rtol=0)
    assert encoded and set(encoded) == {4}  # chunks of 4 rows (the one `lax.cond` branch, traced once), never all 48


def _char_cnn_gradients(cnn, ids, weights, every_row):
    """Gradients of `sum(vectors * weights)` with respect to every trainable weight, through the fast path or through
    every row (`_encode_all`), by the backend's own automatic differentiation."""
    name = backend()

    def vectors(x):
        return cnn._encode_all(cnn._check_ids(x, None)) if every_row else cnn.encode_distinct(x)

    if name == "jax":
        import jax
        import jax.numpy as jnp
        from keras import StatelessScope

        def loss(trainable):
            with StatelessScope(state_mapping=list(zip(cnn.trainable_variables, trainable))):
                return jnp.sum(vectors(ids) * weights)

        return [np.asarray(g) for g in jax.jit(jax.grad(loss))([v.value for v in cnn.trainable_variables])]
    if name == "torch":
        for v in cnn.trainable_variables:
            v.value.grad = None
        (vectors(_tensor(ids)) * _tensor(weights)).sum().backward()
        return [to_numpy(v.value.grad) for v in cnn.trainable_variables]
    import tensorflow as tf

    with tf.GradientTape() as tape:
        total = tf.reduce_sum(vectors(ids) * weights)
    return [tf.convert_to_tensor(g).numpy() for g in tape.gradient(total, cnn.trainable_variables)]  # IndexedSlices


def test_char_cnn_gradients_equal_every_rows():
    """The gradients through the distinct rows (a repeated token's summed over its occurrences) equal those through
    every row at every position, for each weight."""
    cnn = _char_cnn()
    ids = _ids(SENTENCES[:2])
    weights = np.random.default_rng(11).normal(size=(*ids.shape[:2], 6)).astype(np.float32)
    want = _char_cnn_gradients(cnn, ids, weights, every_row=True)
    got = _char_cnn_gradients(cnn, ids, weights, every_row=False)
    _assert_close(got, want, "gradient")
    assert sum(float(np.abs(g).max()) > 1e-2 for g in want) >= len(want) - 1  # (the padding row's gradient is 0)


@pytest.mark.skipif(not FAST, reason="JAX's and PyTorch's paths")
def test_elmo_runs_its_fast_paths_with_the_keras_ops_numbers(monkeypatch, ops_loop_calls):
    """`ELMo` as the README calls it (eager; and under `jax.jit` of `stateless_call` on JAX): the `keras.ops` loop and
    the all-rows char CNN are not called, and the outputs equal those of `implementation="ops"` with every row
    encoded."""
    ids = _ids([["The", "cat", "sat", "."], ["Hi", "!"], []])
    config = BiLMConfig(**TINY)
    reference = ELMo(config, implementation="ops")
    randomize_weights(reference, seed=12)
    monkeypatch.setattr(reference.char_cnn, "encode_distinct", lambda x: reference.char_cnn._encode_all(x))
    want = {k: to_numpy(v) for k, v in reference(ids).items() if k in ("elmo", "lstm_outputs2", "word_emb")}
    elmo = ELMo(config)
    randomize_weights(elmo, seed=12)
    monkeypatch.setattr(elmo.char_cnn, "_encode_all", lambda ids: pytest.fail("every row encoded"))
    runs = [elmo(ids)]
    if backend() == "jax":
        import jax

        trainable = [v.value for v in elmo.trainable_variables]
        frozen = [v.value for v in elmo.non_trainable_variables]
        runs.append(jax.jit(lambda t, f, x: elmo.stateless_call(t, f, x)[0])(trainable, frozen, ids))
    for got in runs:
        for key, value in want.items():
            np.testing.assert_allclose(to_numpy(got[key]), value, atol=ATOL, rtol=0, err_msg=key)
    assert ops_loop_calls == [None] * TINY["num_layers"]  # the reference's only
    assert isinstance(elmo.bilm, BiLM)
