"""The numeric layers and ELMo on the active Keras backend (`KERAS_BACKEND`): TensorFlow in the main run, JAX in a
process of its own in `make test`, PyTorch in `make test-torch` (tests/backend_testlib.py).

On every backend: the layer contract (tests/layer_testlib.py, the `.keras` reload in another process of the same
backend), the outputs ELMoForManyLangs' own code recorded (and tests/test_fixture_parity.py, run beside this file,
bilm-tf's and AllenNLP's), outputs and gradients of a small biLM equal to TensorFlow's own loop and gradient within
1e-5, weight-file and `.keras` round trips, and the README's examples of the backend, run as written.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from backend_testlib import (
    REPO_ROOT,
    SMALL_BILM,
    backend,
    crf_case,
    crf_values,
    language_model_values,
    loss_and_gradients,
    make_crf,
    make_language_model,
    make_small_bilm,
    run_tensorflow_reference,
    slow_off_tensorflow,
    slow_off_tensorflow_test,
    small_bilm_case,
    to_numpy,
)
from docs_testlib import code_blocks
from layer_testlib import any_nonzero, same_mask
from tiny_models import TINY, randomize_weights

import elmo_tf
from elmo_tf.config import BiLMConfig
from elmo_tf.embed import Embedder
from elmo_tf.layers import CRF, BiLM, CharCNN, Highway, ProjectedLSTM, ScalarMix, TokensToCharIds
from elmo_tf.models import ELMo, load_elmo, save_elmo
from elmo_tf.preprocessing.char_rows import BYTE_MAPPING, sentences_to_char_ids

EFML = Path(__file__).resolve().parents[1] / "fixtures" / "efml"
SENTENCES = [["Hello", "world", "!"], ["naïve", "日本語", "<S>", "</S>"], ["z" * 70], []]
LONGER = [["a", "much", "longer", "sentence", "of", "tokens", "!"], ["x"] * 6]
ATOL = 1e-5


def char_ids(sentences):
    """Token lists -> left-aligned int32 char ids `(batch, tokens, 50)`, zero rows for padding (bilm-tf's bytes)."""
    return sentences_to_char_ids(BYTE_MAPPING, sentences)


def _float_inputs(lengths, dim, steps=None, seed=0):
    rng = np.random.default_rng(seed)
    steps = max(lengths) if steps is None else steps
    x = rng.normal(size=(len(lengths), steps, dim)).astype(np.float32)  # padding holds noise too
    return x, np.arange(steps)[None, :] < np.array(lengths)[:, None]


def _contract_cases():
    x6, mask = _float_inputs([5, 2, 0, 4], SMALL_BILM["projection_dim"], steps=5)
    mates6, mates_mask = _float_inputs([7, 6], SMALL_BILM["projection_dim"], seed=1)
    hs, hs_mask = _float_inputs([4, 2, 1, 0], 5, steps=4)
    mixes = [_float_inputs([4, 2, 1, 0], 5, steps=4, seed=k)[0] for k in range(3)]
    mates_mixes = [_float_inputs([6, 5], 5, seed=k + 3)[0] * 100.0 + 50.0 for k in range(3)]
    potentials, _, crf_mask = crf_case()
    mates_potentials = np.random.default_rng(5).normal(size=(2, 8, 5)).astype(np.float32)
    return {
        "CRF": (
            CRF,
            dict(num_tags=5, allowed_transitions=(~np.eye(5, dtype=bool)).tolist()),
            potentials,
            dict(
                mask=crf_mask,
                output_mask=same_mask,
                pad_value=50.0,
                batch_mates=mates_potentials,
                batch_mates_mask=np.arange(8)[None, :] < np.array([[8], [7]]),
                weight_scale=1.0,
            ),
        ),
        "CharCNN": (
            CharCNN,
            dict(filters=((1, 4), (2, 8)), num_highway=2, projection_dim=6, char_embedding_dim=3),
            char_ids(SENTENCES),
            dict(pad_value=0, batch_mates=char_ids(LONGER), output_mask=any_nonzero, weight_scale=0.5),
        ),
        "Highway": (Highway, dict(num_layers=2), hs, dict(mask=hs_mask, output_mask=same_mask)),
        "ProjectedLSTM": (
            ProjectedLSTM,
            dict(units=8, projection_dim=6, cell_clip=0.8, proj_clip=0.5, go_backwards=True),
            x6,
            dict(mask=mask, output_mask=same_mask, pad_value=1e3, batch_mates=mates6, batch_mates_mask=mates_mask),
        ),
        "BiLM": (
            BiLM,
            SMALL_BILM,
            x6,
            dict(
                mask=mask, output_mask=same_mask, pad_value=1e3, batch_mates=mates6 * 10.0, batch_mates_mask=mates_mask
            ),
        ),
        "ScalarMix": (
            ScalarMix,
            dict(num_layers=3, layer_norm=True, l2_coef=0.001),
            mixes,
            dict(
                mask=hs_mask,
                output_mask=same_mask,
                pad_value=1e3,
                batch_mates=mates_mixes,
                batch_mates_mask=np.arange(6)[None, :] < np.array([6, 5])[:, None],
            ),
        ),
    }


@pytest.mark.parametrize(  # ProjectedLSTM: inside BiLM's contract too; alone it costs 19 s off TensorFlow
    "name",
    ["CharCNN", "Highway", pytest.param("ProjectedLSTM", marks=slow_off_tensorflow()), "BiLM", "ScalarMix", "CRF"],
)
def test_layer_contract(name, layer_contract):
    """Config, shapes, masks, padding and batch-mates, `.keras` reload in another process of this backend."""
    cls, init, inputs, options = _contract_cases()[name]
    layer, outputs = layer_contract(cls, init, inputs, **options)
    flat = outputs if isinstance(outputs, list) else [outputs]
    assert all(np.abs(out).max() > 1e-2 for out in flat)  # the comparisons are not of zeros (CRF: not all tag 0)


@pytest.fixture(scope="module")
def tensorflow_reference(tmp_path_factory):
    """The small biLM's outputs, loss and gradients under TensorFlow's own loop (`implementation="scan"`)."""
    return run_tensorflow_reference(tmp_path_factory.mktemp("tf_reference") / "reference.npz")


@pytest.mark.xdist_group("tensorflow_reference")  # on one worker: the module runs TensorFlow once for the three
def test_outputs_and_gradients_equal_tensorflows(tensorflow_reference):
    """The default loop of this backend ("ops" off TensorFlow; on TensorFlow the hand-written gradient of "auto" in
    training) gives TensorFlow's outputs and, by the backend's own automatic differentiation, its gradients with
    respect to the inputs and every weight, within 1e-5 of their scale."""
    x, mask, loss_weights = small_bilm_case()
    bilm = make_small_bilm()
    outputs = [to_numpy(out) for out in bilm(x, mask=mask)]
    for k, out in enumerate(outputs):
        np.testing.assert_allclose(out, tensorflow_reference[f"out{k}"], atol=ATOL, rtol=0, err_msg=f"layer {k}")
    grads = loss_and_gradients(bilm, x, mask, loss_weights)
    assert len(grads) == 2 + len(bilm.trainable_variables) == 2 + 4 * 2 * SMALL_BILM["num_layers"]
    for k, got in enumerate(grads):
        want = tensorflow_reference[f"grad{k}"]
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(got, want, atol=ATOL * scale, rtol=0, err_msg=f"loss/gradient {k}")
    assert all(float(np.abs(tensorflow_reference[f"grad{k}"]).max()) > 1e-2 for k in range(1, len(grads)))


@pytest.mark.xdist_group("tensorflow_reference")  # on one worker: the module runs TensorFlow once for the three
def test_crf_decodes_and_scores_as_on_tensorflow(tensorflow_reference):
    """The CRF (transition constraints, empty and one-tag sentences) gives TensorFlow's Viterbi tags and scores and
    log-likelihoods, and the same gradients with respect to the potentials and each weight, within 1e-5."""
    values = crf_values(make_crf(), *crf_case())
    np.testing.assert_array_equal(values[0], tensorflow_reference["crf0"])
    assert values[0][0].any() and len(values) == 4 + 3
    for k in range(1, len(values)):
        want = tensorflow_reference[f"crf{k}"]
        np.testing.assert_allclose(values[k], want, atol=ATOL * max(1.0, float(np.abs(want).max())), rtol=0)


@pytest.mark.xdist_group("tensorflow_reference")  # on one worker: the module runs TensorFlow once for the three
def test_language_model_scores_as_on_tensorflow(tensorflow_reference):
    """`LanguageModel.score_tokens` (Python strings off TensorFlow): TensorFlow's log-probabilities of both
    directions within 1e-5, the same top-k ids and words, zeros and "" past each sentence's n + 1; its softmax runs
    in chunks of 4 of the 9 words, so the merges of the logsumexp and of the top k are on the path."""
    got = language_model_values(make_language_model())
    for key, value in got.items():
        want = tensorflow_reference[f"lm_{key}"]
        if value.dtype.kind == "f":
            np.testing.assert_allclose(value, want, atol=ATOL, rtol=0, err_msg=key)
        else:
            np.testing.assert_array_equal(value, want, err_msg=key)
    assert got["sequence_len"].tolist() == [7, 3, 1] and (got["forward_log_probs"][:, 0] < -0.1).all()
    assert got["forward_top_k_words"][2, 2:].tolist() == [["", "", ""]] * (got["forward_top_k_words"].shape[1] - 2)


@slow_off_tensorflow_test
def test_load_language_model_reads_its_four_files(tmp_path):
    """`load_language_model` (options.json, weights.hdf5, softmax.hdf5, vocab.txt) gives the model it was written
    from, on this backend."""
    import h5py
    from backend_testlib import LM_WORDS

    from elmo_tf.io import save_bilm_weights
    from elmo_tf.models import load_language_model

    lm = make_language_model()
    lm.config.to_json(tmp_path / "options.json")
    save_bilm_weights(lm, tmp_path / "weights.hdf5")
    with h5py.File(tmp_path / "softmax.hdf5", "w") as f:
        f["softmax/W"] = to_numpy(lm.softmax_kernel)
        f["softmax/b"] = to_numpy(lm.softmax_bias)
    (tmp_path / "vocab.txt").write_text("\n".join(LM_WORDS) + "\n")
    names = ("options.json", "weights.hdf5", "softmax.hdf5", "vocab.txt")
    again = load_language_model(*(tmp_path / name for name in names), top_k=3, chunk_size=4)
    want, got = language_model_values(lm), language_model_values(again)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_tokens_to_char_ids_maps_python_strings():
    """`TokensToCharIds` gives the char ids of bilm-tf's mapping on every backend: tf.string on TensorFlow, a NumPy
    array of strings elsewhere (as keras-hub's tokenizers hand theirs to JAX and PyTorch)."""
    tokens = np.array([["Hello", "world", "!"], ["naïve", "", ""]], dtype=object)
    if backend() == "tensorflow":
        import tensorflow as tf

        tokens = tf.constant(tokens.astype(str))
    got = to_numpy(TokensToCharIds()(tokens))
    np.testing.assert_array_equal(got, char_ids([["Hello", "world", "!"], ["naïve"]]))


def test_bfloat16_matmuls_hold_bfloat16_precision():
    """`implementation="ops", matmul_dtype="bfloat16"` runs every matmul in bfloat16 (a GPU's fast inference): the
    outputs differ from float32's, by about bfloat16's rounding (relative 2^-9 per product), not more."""
    x, mask, _ = small_bilm_case()
    exact = [to_numpy(o) for o in make_small_bilm(implementation="ops")(x, mask=mask)]
    low = [to_numpy(o) for o in make_small_bilm(implementation="ops", matmul_dtype="bfloat16")(x, mask=mask)]
    worst = max(float(np.abs(a - b).max()) for a, b in zip(exact, low))
    assert 1e-4 < worst < 0.05, worst


def _efml_expected(name):
    with np.load(EFML / name / "expected.npz") as data:
        return {key: data[key] for key in data.files}


@pytest.mark.parametrize("name", [pytest.param("word", marks=slow_off_tensorflow()), "noword"])
def test_elmoformanylangs_recorded_outputs(name, tmp_path):
    """A converted ELMoForManyLangs model gives the outputs its own code recorded, at every layer, within 1e-5, from
    the char and word ids that code recorded; the NumPy mapping (`char_mapping.numpy`, no TensorFlow) gives those
    ids from the sentences."""
    import json

    from elmo_tf.convert.elmoformanylangs import convert

    convert(str(EFML / name / "model"), str(tmp_path))
    elmo = load_elmo(tmp_path / "options.json", tmp_path / "weights.hdf5")
    expected = _efml_expected(name)
    lengths = expected["lengths"]
    ids = expected["char_ids"][:, 1:] + 1  # (S, T + 2, 50) with <bos>/<eos> rows: the model adds its own
    if name == "word":
        ids = np.concatenate([ids, expected["word_ids"][:, 1:, None] + 1], axis=-1)
    ids = ids[:, : int(lengths.max())] * (np.arange(int(lengths.max()))[None, :, None] < lengths[:, None, None])
    sentences = json.loads((EFML / "sentences.json").read_text(encoding="utf-8"))
    if backend() != "tensorflow":
        np.testing.assert_array_equal(elmo.tokens_to_char_ids(sentences), ids)
        padded = [s + [""] * (int(lengths.max()) - len(s)) for s in sentences]
        layer = TokensToCharIds.for_config(elmo.config)
        np.testing.assert_array_equal(to_numpy(layer(np.array(padded, dtype=object))), ids)
    activations = [to_numpy(a) for a in elmo(ids.astype(np.int32))["activations"]]
    worst = max(
        float(np.abs(activations[layer][k, :n] - expected["activations"][k, layer, :n]).max())
        for layer in range(len(activations))
        for k, n in enumerate(lengths)
    )
    assert worst <= ATOL and np.abs(expected["activations"]).max() > 0.05, worst


@slow_off_tensorflow_test
def test_a_converted_bilm_tf_checkpoint_gives_the_recorded_outputs(tmp_path):
    """`elmo-tf convert --from bilm-tf-checkpoint` (TensorFlow reads the TF1 checkpoint: installed beside any backend)
    gives files that load on this backend and reproduce bilm-tf's recorded first batch within 1e-5."""
    import importlib.util
    import json

    import h5py
    from convert_testlib import FIXTURES, converted_checkpoint

    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("reading a TF1 checkpoint needs TensorFlow installed")
    out = converted_checkpoint(tmp_path)
    elmo = load_elmo(out / "options.json", out / "weights.hdf5")
    sentences = json.loads((FIXTURES.parent.parent / "allennlp" / "sentences.json").read_text())
    batch = [sentences[k][0].split() for k in range(3)]
    top = to_numpy(elmo(char_ids(batch))["activations"][-1])
    with h5py.File(FIXTURES / "lm_embeddings_0.hdf5", "r") as f:
        want = f["0"][...]  # sentence 0 of batch 0: (2, tokens, P), zero initial state
    p = want.shape[-1]
    got = np.stack([top[0, : len(batch[0]), :p], top[0, : len(batch[0]), p:]])
    assert np.abs(got - want).max() < ATOL


def _tiny_elmo(seed=0):
    elmo = ELMo(BiLMConfig(**TINY), mixes=("elmo", "ner"))
    randomize_weights(elmo, seed=seed)
    return elmo


def test_weight_files_and_keras_files_round_trip(tmp_path):
    """`save_elmo` / `load_elmo` (options.json + weights.hdf5) and `.keras` (`elmo_tf.load_model`) give the same
    outputs on this backend; weight files are the same on every backend."""
    elmo = _tiny_elmo()
    ids = char_ids(SENTENCES)
    want = {key: to_numpy(value) for key, value in elmo(ids).items() if key not in ("activations",)}
    save_elmo(elmo, str(tmp_path / "files"))
    again = load_elmo(tmp_path / "files" / "options.json", tmp_path / "files" / "weights.hdf5", mixes=("elmo", "ner"))
    for mix_from, mix_to in zip(elmo.scalar_mixes, again.scalar_mixes):  # mixes are not in weight files
        mix_to.set_weights(mix_from.get_weights())
    elmo.save(tmp_path / "elmo.keras")
    reloaded = elmo_tf.load_model(tmp_path / "elmo.keras")
    for model in (again, reloaded):
        got = model(ids)
        for key, value in want.items():
            np.testing.assert_allclose(to_numpy(got[key]), value, atol=1e-6, rtol=0, err_msg=key)
    assert np.abs(want["elmo"]).max() > 1e-2


def test_embed_tokens_takes_python_strings():
    """Off TensorFlow, `embed_tokens` takes sentences of Python strings (`char_mapping.numpy`): the same outputs as
    the char ids; padding "" and ragged sentences alike."""
    if backend() == "tensorflow":
        pytest.skip("on TensorFlow embed_tokens takes tf.string tensors (tests/models/test_elmo.py)")
    elmo = _tiny_elmo()
    got = elmo.embed_tokens([["Hello", "world", "!"], ["naïve", ""], []])
    want = elmo(char_ids([["Hello", "world", "!"], ["naïve"], []]))
    for key in ("elmo", "mask", "sequence_len"):
        np.testing.assert_array_equal(to_numpy(got[key]), to_numpy(want[key]))


@pytest.fixture(scope="module")
def embedder_case():
    """A tiny model, sentences for `Embedder` (packed rows of several, one longer than a row of 8 positions, an empty
    one) and each sentence's ELMo layers alone (one padded batch of the model: each row as alone)."""
    elmo = _tiny_elmo()
    rng = np.random.default_rng(1)
    words = "the a of cat dog <S> </S> İSTANBUL naïve , . big".split() + ["z" * 70]
    sentences = [[words[k] for k in rng.integers(0, len(words), rng.integers(1, 6))] for _ in range(9)]
    sentences += [["x"] * 7, []]
    batch = [to_numpy(a) for a in elmo(char_ids(sentences))["activations"]]
    return elmo, sentences, [[a[i, : len(s)] for a in batch] for i, s in enumerate(sentences)]


@pytest.mark.parametrize(  # off TensorFlow each `layers` compiles its own program: "all" in make test
    "layers", ["all", *(pytest.param(layers, marks=slow_off_tensorflow()) for layers in ("top", "average"))]
)
def test_the_embedder_gives_each_sentence_its_outputs_alone(embedder_case, layers):
    """`elmo_tf.embed.Embedder` on this backend (`backend_functions`: under JAX the biLM `jax.jit`-compiled on rows
    and steps padded to a few shapes): packed rows, a sentence longer than a row, an empty one, distinct tokens and
    the memo across batches: each sentence's layers equal those of the model on it alone."""
    elmo, sentences, alone = embedder_case
    embedder = Embedder(elmo, layers, row_length=8, memo_size=8)
    got = embedder.embed_batch(sentences[:5]) + embedder.embed_batch(sentences[5:])
    assert embedder.stats["memo"] > 0 and embedder.stats["distinct"] < embedder.stats["tokens"]
    for s, array, acts in zip(sentences, got, alone):
        assert array.dtype == np.float32 and array.shape == embedder.shape_of(len(s))
        if s:
            want = np.stack(acts) if layers == "all" else acts[-1] if layers == "top" else np.mean(acts, axis=0)
            np.testing.assert_allclose(array, want, atol=ATOL, rtol=0)


def test_the_embedder_example_runs(tmp_path, monkeypatch):
    """docs/backends.md's `Embedder` example runs as written on this backend (JAX in make test, PyTorch in make
    test-torch; the block's `KERAS_BACKEND` line comes after Keras is imported here, so it changes nothing) next to a
    tiny model's files: one NumPy array `(L+1, n, 2P)` per sentence."""
    if backend() == "tensorflow":
        pytest.skip("tests/embed covers the Embedder on TensorFlow")
    (block,) = [
        b
        for b in code_blocks(REPO_ROOT / "docs" / "backends.md")
        if 'embedder = Embedder(elmo, layers="all")' in b.code
    ]
    save_elmo(_tiny_elmo(), str(tmp_path))
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(block.code, block.where, "exec"), namespace)
    width = 2 * TINY["projection_dim"]
    assert [a.shape for a in namespace["arrays"]] == [
        (TINY["num_layers"] + 1, 4, width),
        (TINY["num_layers"] + 1, 2, width),
    ]


@pytest.mark.parametrize(  # installed: the same run as not-installed with TensorFlow importable (28 s under JAX)
    "blocked", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["not-installed", "installed"]
)
def test_runs_where_tensorflow_is_not_installed(blocked, tmp_path):
    """In a process where `import tensorflow` fails (a machine with JAX or PyTorch only), `elmo_tf.load_elmo` loads a
    model, maps Python strings and embeds them, with this process's outputs, and the `Embedder` encodes tokens (its
    whole run: test_the_embedder_gives_each_sentence_its_outputs_alone); and where TensorFlow is installed, all that
    loads none of it."""
    if backend() == "tensorflow":
        pytest.skip("the TensorFlow backend needs TensorFlow")
    elmo = _tiny_elmo()
    save_elmo(elmo, str(tmp_path))
    sentences = [["Hello", "world", "!"], ["naïve"]]
    np.save(
        tmp_path / "want.npy", to_numpy(elmo.embed_tokens(sentences)["lstm_outputs2"])
    )  # no mix: not in weight files
    script = f"""
import sys

if {blocked!r}:
    sys.modules["tensorflow"] = None  # import tensorflow raises ImportError, as where it is not installed
import numpy as np
import elmo_tf
elmo = elmo_tf.load_elmo({str(tmp_path / "options.json")!r}, {str(tmp_path / "weights.hdf5")!r}, mixes=("elmo", "ner"))
got = elmo.embed_tokens({sentences!r})["lstm_outputs2"]
got = got.detach().numpy() if hasattr(got, "detach") else np.asarray(got)
np.testing.assert_allclose(got, np.load({str(tmp_path / "want.npy")!r}), atol=1e-6, rtol=0)
from elmo_tf.embed import Embedder
table, rows = Embedder(elmo, "top").token_vectors([b"Hello", b"world", b"Hello"])  # the char CNN's path
assert table.shape == (5, {TINY["projection_dim"]}) and rows.tolist() == [3, 4, 3]
assert sys.modules.get("tensorflow") is None  # not loaded, though installed here (unless blocked)
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


# the README's examples of each backend: a distinctive line of the block -> the backend it runs on
README_EXAMPLES = {
    "class Tagger(torch.nn.Module):": "torch",
    "def train_step(trainable, non_trainable, char_ids, targets):": "jax",
}


def _readme_block(key):
    blocks = [b for b in code_blocks(REPO_ROOT / "README.md") if b.language == "python" and key in b.code]
    assert len(blocks) == 1, f"README.md has {len(blocks)} Python blocks holding {key!r}"
    return blocks[0]


FREEZE = "elmo.char_cnn.trainable = elmo.bilm.trainable = False"


@pytest.mark.parametrize("unfrozen", [False, True], ids=["as-written", "biLM-unfrozen"])
@pytest.mark.parametrize("key", sorted(README_EXAMPLES))
def test_readme_example_runs_as_written(key, unfrozen, tmp_path, monkeypatch):
    """The README's PyTorch example (ELMo in a torch.nn.Module, a plain PyTorch training loop) and JAX example (a
    jax.jit-compiled embedding, a stateless training step) run as written next to a tiny model's files; training
    changes the weights it trains (the ScalarMix; the biLM only when unfrozen: the PyTorch example with its freezing
    line set to True) and leaves the others."""
    if backend() != README_EXAMPLES[key]:
        pytest.skip(f"the example runs on {README_EXAMPLES[key]}")
    block = _readme_block(key)
    code = block.code
    if unfrozen:
        if FREEZE not in code:
            pytest.skip("the example trains the whole model as written")
        code = code.replace(FREEZE, FREEZE.replace("False", "True"))
    save_elmo(_tiny_elmo(), str(tmp_path))
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(code, block.where, "exec"), namespace)
    elmo = namespace["elmo"]
    before = load_elmo("options.json", "weights.hdf5")
    changed = {
        v.path: not np.array_equal(to_numpy(v), to_numpy(w)) for v, w in zip(elmo.weights, before.weights) if v.shape
    }
    assert any(changed[p] for p in changed if "mix_elmo" in p), changed
    bilm_changed = any(changed[p] for p in changed if "bilm" in p)
    assert bilm_changed == elmo.bilm.trainable, changed


def test_the_backend_is_the_one_asked_for():
    """`make test` runs this file under JAX, `make test-torch` under PyTorch: each run is of the backend it names; off
    TensorFlow (tests/conftest.py's seeding, `keras.utils.set_random_seed`, loads it where it is installed)."""
    assert backend() == os.environ.get("KERAS_BACKEND", "tensorflow")
