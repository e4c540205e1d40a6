"""What the tests of tests/backends share: the active Keras backend, tensors to NumPy, gradients by each backend's
own automatic differentiation, and the TensorFlow reference computed in a TensorFlow process.

`make test` runs tests/backends (and tests/test_fixture_parity.py) under `KERAS_BACKEND=jax` in a pytest process of
its own, `make test-torch` under `KERAS_BACKEND=torch`; the main run runs them under TensorFlow. The gradient
reference is always TensorFlow's, computed with `implementation="scan"` (TensorFlow's automatic gradient of its own
loop) in another process: `python tests/backend_testlib.py OUT.npz` with `KERAS_BACKEND=tensorflow`.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent

# the small biLM of the gradient comparison: clips that bind, a residual layer, padding in the batch
SMALL_BILM = dict(num_layers=2, units=12, projection_dim=6, cell_clip=0.8, proj_clip=0.6, use_skip_connections=True)
LENGTHS = (6, 3, 5, 1)


def backend():
    import keras

    return keras.config.backend()


def slow_off_tensorflow():
    """Marks for a test case that is cheap under TensorFlow and costs 15-60 s under JAX or PyTorch on 2 cores (compiled
    or dispatched op by op): `slow` there (make test-slow runs it under JAX), none under TensorFlow."""
    import pytest

    return [] if backend() == "tensorflow" else [pytest.mark.slow]


def slow_off_tensorflow_test(function):
    """`slow_off_tensorflow` as a decorator of a test function."""
    for mark in slow_off_tensorflow():
        function = mark(function)
    return function


def to_numpy(x):
    """A backend tensor (a PyTorch one that requires grad included) as NumPy."""
    import keras

    return x if isinstance(x, np.ndarray) else keras.ops.convert_to_numpy(x)


def small_bilm_case(seed=0):
    """`(x, mask, loss_weights)` of the gradient comparison, as NumPy: inputs `(4, 6, 6)` with the mask of `LENGTHS`
    (zeros at padding), the loss's weights per layer output."""
    rng = np.random.default_rng(seed)
    proj = SMALL_BILM["projection_dim"]
    steps = max(LENGTHS)
    mask = np.arange(steps)[None, :] < np.array(LENGTHS)[:, None]
    x = (rng.normal(size=(len(LENGTHS), steps, proj)) * mask[:, :, None]).astype(np.float32)
    loss_weights = rng.normal(size=(SMALL_BILM["num_layers"], len(LENGTHS), steps, 2 * proj)).astype(np.float32)
    return x, mask, loss_weights


def make_small_bilm(seed=1, **kwargs):
    """The small biLM, every weight N(0, 0.4^2) drawn in `weights` order (the same numbers on every backend)."""
    from elmo_tf.layers import BiLM

    bilm = BiLM(**SMALL_BILM, **kwargs)
    bilm.build((None, None, SMALL_BILM["projection_dim"]))
    rng = np.random.default_rng(seed)
    for variable in bilm.weights:
        variable.assign(rng.normal(0.0, 0.4, size=tuple(variable.shape)).astype(np.float32))
    return bilm


def loss_and_gradients(bilm, x, mask, loss_weights):
    """`sum_l sum(bilm(x)[l] * loss_weights[l])` and its gradients with respect to `x` and every trainable weight,
    by the active backend's own automatic differentiation (in training mode), as NumPy: `[loss, d_x, d_w...]`."""
    name = backend()
    if name == "jax":
        import jax
        import jax.numpy as jnp

        def loss(trainable, x):
            outputs, _ = bilm.stateless_call(
                trainable, [v.value for v in bilm.non_trainable_variables], x, mask=mask, training=True
            )
            return sum(jnp.sum(out * w) for out, w in zip(outputs, loss_weights))

        value, (d_w, d_x) = jax.value_and_grad(loss, argnums=(0, 1))([v.value for v in bilm.trainable_variables], x)
        return [np.asarray(value), np.asarray(d_x)] + [np.asarray(g) for g in d_w]
    if name == "torch":
        import torch

        x = torch.tensor(x, requires_grad=True)
        outputs = bilm(x, mask=torch.tensor(mask), training=True)
        loss = sum(torch.sum(out * torch.tensor(w)) for out, w in zip(outputs, loss_weights))
        loss.backward()
        return [to_numpy(loss), to_numpy(x.grad)] + [to_numpy(v.value.grad) for v in bilm.trainable_variables]
    import tensorflow as tf

    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        outputs = bilm(x, mask=tf.constant(mask), training=True)
        loss = sum(tf.reduce_sum(out * w) for out, w in zip(outputs, loss_weights))
    grads = tape.gradient(loss, [x] + bilm.trainable_variables)
    return [loss.numpy()] + [g.numpy() for g in grads]


def crf_case(seed=2):
    """`(potentials, tags, mask)` of the CRF comparison: `(4, 6, 5)` potentials, sentences of 6, 3, 1 and 0 tags."""
    rng = np.random.default_rng(seed)
    lengths = (6, 3, 1, 0)
    mask = np.arange(6)[None, :] < np.array(lengths)[:, None]
    potentials = rng.normal(size=(4, 6, 5)).astype(np.float32)
    tags = (rng.integers(0, 5, size=(4, 6)) * mask).astype(np.int32)
    return potentials, tags, mask


def make_crf(seed=3):
    """A CRF of 5 tags with forbidden transitions and starts, weights N(0, 1) drawn in `weights` order."""
    from elmo_tf.layers import CRF

    allowed = np.ones((5, 5), bool)
    allowed[0, 3] = allowed[2, 1] = False
    crf = CRF(5, allowed_transitions=allowed.tolist(), allowed_start=[True, True, False, True, True])
    crf.build((None, None, 5))
    rng = np.random.default_rng(seed)
    for variable in crf.weights:
        variable.assign(rng.normal(size=tuple(variable.shape)).astype(np.float32))
    return crf


def crf_values(crf, potentials, tags, mask):
    """The CRF's Viterbi tags and scores, its log-likelihoods, and the gradients of their sum with respect to the
    potentials and each weight, by the active backend's automatic differentiation, as NumPy."""
    decoded, best = crf.decode(potentials, mask)
    values = [to_numpy(decoded), to_numpy(best)]
    name = backend()
    if name == "jax":
        import jax
        from keras import StatelessScope

        weights = [v.value for v in crf.trainable_variables]
        ll = crf.log_likelihood(potentials, tags, mask)

        def loss(weights, potentials):  # the weights as arguments, as stateless_call takes them
            with StatelessScope(state_mapping=list(zip(crf.trainable_variables, weights))):
                return crf.log_likelihood(potentials, tags, mask).sum()

        d_w, d_p = jax.grad(loss, argnums=(0, 1))(weights, potentials)
        return values + [to_numpy(ll), np.asarray(d_p)] + [np.asarray(g) for g in d_w]
    if name == "torch":
        import torch

        p = torch.tensor(potentials, requires_grad=True)
        ll = crf.log_likelihood(p, torch.tensor(tags), torch.tensor(mask))
        ll.sum().backward()
        return values + [to_numpy(ll), to_numpy(p.grad)] + [to_numpy(v.value.grad) for v in crf.trainable_variables]
    import tensorflow as tf

    p = tf.constant(potentials)
    with tf.GradientTape() as tape:
        tape.watch(p)
        ll = crf.log_likelihood(p, tags, mask)
        total = tf.reduce_sum(ll)
    grads = tape.gradient(total, [p] + crf.trainable_variables)
    return values + [ll.numpy()] + [g.numpy() for g in grads]


LM_WORDS = ["</S>", "<S>", "<UNK>", "the", "cat", "sat", "on", "mat", "."]
LM_SENTENCES = [["the", "cat", "sat", "on", "the", "mat", "."], ["a", "cat", "."], ["."]]


def make_language_model(seed=4):
    """A tiny `LanguageModel` (tests/tiny_models.py's biLM, 9 words, top 3, chunks of 4 words: three chunks merged),
    every weight N(0, 0.3^2) drawn in `weights` order, its vocabulary attached."""
    from tiny_models import TINY

    from elmo_tf.config import BiLMConfig
    from elmo_tf.models import LanguageModel

    lm = LanguageModel(BiLMConfig(**TINY), len(LM_WORDS), 1, 0, 2, top_k=3, chunk_size=4)
    rng = np.random.default_rng(seed)
    for variable in lm.weights:
        variable.assign(rng.normal(0.0, 0.3, size=tuple(variable.shape)).astype(np.float32))
    lm.use_vocabulary(LM_WORDS)
    return lm


def language_model_values(lm):
    """`score_tokens` of LM_SENTENCES on the active backend: log-probabilities and top-k of both directions."""
    if backend() == "tensorflow":
        import tensorflow as tf

        width = max(map(len, LM_SENTENCES))
        out = lm.score_tokens(tf.constant([s + [""] * (width - len(s)) for s in LM_SENTENCES]))
    else:
        out = lm.score_tokens(LM_SENTENCES)
    keys = ("sequence_len", "forward_log_probs", "backward_log_probs", "forward_top_k_ids", "backward_top_k_ids")
    keys += ("forward_top_k_log_probs", "backward_top_k_log_probs")
    values = {key: to_numpy(out[key]) for key in keys}
    for direction in ("forward", "backward"):
        words = out[f"{direction}_top_k_words"]
        words = words.numpy() if hasattr(words, "numpy") else words
        values[f"{direction}_top_k_words"] = np.array(
            [w.decode() if isinstance(w, bytes) else w for w in np.asarray(words).reshape(-1)]
        ).reshape(np.shape(words))
    return values


def tensorflow_reference(path):
    """Writes `path` (.npz): the outputs (`out<l>`) and the loss and gradients (`grad<k>`, `loss_and_gradients`'s
    order) of the small biLM under TensorFlow's own loop and automatic gradient, and the CRF's `crf_values` (`crf<k>`);
    run with KERAS_BACKEND=tensorflow."""
    assert backend() == "tensorflow", f"the reference is TensorFlow's; Keras runs on {backend()}"
    x, mask, loss_weights = small_bilm_case()
    bilm = make_small_bilm(implementation="scan")
    outputs = [o.numpy() for o in bilm(x, mask=mask)]
    grads = loss_and_gradients(bilm, x, mask, loss_weights)
    crf = crf_values(make_crf(), *crf_case())
    lm = language_model_values(make_language_model())
    np.savez(
        path,
        **{f"lm_{key}": value for key, value in lm.items()},
        **{f"out{k}": o for k, o in enumerate(outputs)},
        **{f"grad{k}": g for k, g in enumerate(grads)},
        **{f"crf{k}": v for k, v in enumerate(crf)},
    )


def run_tensorflow_reference(path, timeout_s=600):
    """Runs `tensorflow_reference(path)` in a TensorFlow process; returns the loaded arrays."""
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), str(TESTS_DIR), env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, str(Path(__file__)), str(path)], env=env, capture_output=True, text=True, timeout=timeout_s
    )
    assert done.returncode == 0, f"the TensorFlow reference failed: {done.stderr[-3000:]}"
    with np.load(path) as data:
        return {key: data[key] for key in data.files}


if __name__ == "__main__":
    tensorflow_reference(sys.argv[1])
