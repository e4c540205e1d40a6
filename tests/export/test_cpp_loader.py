"""Conformance with TF Serving's C++ loader: export/cpp/savedmodel_check (tensorflow::LoadSavedModel + Session::Run).

The checker is compiled once per source/tensorflow version into build/export_cpp/<hash>/ (export/cpp/build.sh);
these tests skip only where no C++ compiler is installed.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from export_testlib import load_test_model

import elmo_tf.saved_model.export as ex
from elmo_tf.preprocessing.tokenizer import tf_text_op_library
from elmo_tf.saved_model.contract import activations_from_outputs, pack_token_lists

REPO = Path(__file__).resolve().parents[2]

BUILD_SCRIPT = REPO / "export" / "cpp" / "build.sh"
ATOL = 1e-5
SENTENCES = [
    b"The cat sat on the mat .",
    b"Dogs are in the fog , aren't they ?",
    b"",
    b"ELMo",
    "Zürich , naïve café !".encode(),
    b"bad \xff\xfe bytes " + b"x" * 60,
]


@pytest.fixture(scope="module")
def checker():
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        pytest.skip(
            f"{cxx} not found: the conformance check with TF Serving's C++ loader needs a C++17 compiler "
            f"(apt-get install g++)"
        )
    proc = subprocess.run(["bash", str(BUILD_SCRIPT), sys.executable], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, f"building the C++ checker failed:\n{proc.stderr[-6000:]}"
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def model():
    return load_test_model()


def write_request(path, runs):
    """The checker's request file: `run <label> <signature>`, `input <key> <dtype> <rank> <dims>` + values, `end`."""
    with open(path, "wb") as f:
        for label, signature, inputs in runs:
            f.write(f"run {label} {signature}\n".encode())
            for key, array in inputs.items():
                array = np.asarray(array)
                dims = " ".join(str(d) for d in array.shape)
                if array.dtype == object or array.dtype.kind == "S":
                    f.write(f"input {key} string {array.ndim} {dims}\n".encode())
                    for value in array.reshape(-1):
                        f.write(f"{len(value)}:".encode() + bytes(value) + b"\n")
                elif array.dtype == bool:
                    f.write(f"input {key} bool {array.ndim} {dims}\n".encode())
                    f.write((" ".join(str(int(v)) for v in array.reshape(-1)) + "\n").encode())
                else:
                    f.write(f"input {key} int32 {array.ndim} {dims}\n".encode())
                    f.write((" ".join(str(int(v)) for v in array.reshape(-1)) + "\n").encode())
            f.write(b"end\n")


def run_checker(checker, export_dir, tmp_path, runs, op_libraries=(), sentences=()):
    request = tmp_path / "request.txt"
    write_request(request, runs)
    out_dir = tmp_path / "cpp_out"
    cmd = [checker, "--export_dir", str(export_dir), "--request", str(request), "--output_dir", str(out_dir)]
    for library in op_libraries:
        cmd += ["--op_library", library]
    for sentence in sentences:
        cmd += ["--sentence", sentence]
    proc = subprocess.run(cmd, capture_output=True, timeout=600)
    outputs = {}
    if proc.returncode == 0:
        for label, _, _ in runs:
            outputs[label] = {p.stem: np.load(p) for p in (out_dir / label).glob("*.npy")}
    return proc, outputs


def assert_close(expected, actual, what):
    diffs = ex.compare_outputs(expected, actual)
    for key, diff in diffs.items():
        limit = ATOL if np.asarray(expected[key]).dtype.kind == "f" else 0
        assert diff <= limit, f"{what}: output {key!r} differs by {diff} (limit {limit}); all: {diffs}"
    return max(diffs.values(), default=0.0)


LM_WORDS = ["<S>", "</S>", "<UNK>"] + "The cat sat on the mat . Dogs are in fog".split()


@pytest.fixture(scope="module")
def lm_export(model, tmp_path_factory):
    """`(export_dir, lm)`: the test model exported with an `lm` signature (a random softmax over LM_WORDS, top k 2):
    every signature of an ELMo export, `lm` included, in one SavedModel for one run of the C++ loader."""
    import h5py

    from elmo_tf.models import load_language_model

    directory = tmp_path_factory.mktemp("lm_export")
    rng = np.random.default_rng(0)
    with h5py.File(directory / "softmax.hdf5", "w") as f:
        f["softmax/W"] = rng.normal(0, 0.5, size=(len(LM_WORDS), model.config.projection_dim)).astype(np.float32)
        f["softmax/b"] = rng.normal(0, 0.5, size=len(LM_WORDS)).astype(np.float32)
    (directory / "vocab.txt").write_text("\n".join(LM_WORDS) + "\n")
    lm = load_language_model(
        None, None, str(directory / "softmax.hdf5"), str(directory / "vocab.txt"), elmo=model, top_k=2
    )
    return ex.export_elmo(model, str(directory / "models" / "elmo"), lm=lm), lm


@pytest.fixture(scope="module")
def every_signature_run(checker, lm_export, tmp_path_factory):
    """ONE run of the C++ loader on `lm_export` answers test_cpp_loader_runs_every_signature_like_python (the
    sentence, token and packed signatures, empty batches, `--sentence`) and
    test_cpp_loader_runs_the_lm_signature_like_python (the `lm` signature). Returns `(proc, outputs, inputs)`."""
    export_dir, _ = lm_export
    token_lists = ex.reference_tokens(SENTENCES)
    tokens, lengths = ex._pad(token_lists)
    junk = np.where(tokens == b"", b"junk", tokens)
    empty_inside = np.array([[b"a", b"", b"b"], [b"c", b"d", b"x"]], object)
    runs = [
        ("default", "default", {"sentences": np.array(SENTENCES, object)}),
        ("serving_default", "serving_default", {"sentences": np.array(SENTENCES, object)}),
        ("tokens", "tokens", {"tokens": junk, "sequence_len": lengths}),
        ("empty_inside", "tokens", {"tokens": empty_inside, "sequence_len": np.array([3, 2])}),
        ("empty_batch", "default", {"sentences": np.zeros([0], object)}),
        ("empty_batch_tokens", "tokens", {"tokens": np.zeros([0, 0], object), "sequence_len": np.zeros([0], np.int32)}),
        ("lm", "lm", {"tokens": junk, "sequence_len": lengths}),
    ]
    ((packed_inputs, placed),) = pack_token_lists(token_lists)
    runs.append(("packed", "packed", packed_inputs))
    tmp_path = tmp_path_factory.mktemp("every_signature")
    proc, got = run_checker(checker, export_dir, tmp_path, runs, sentences=["a b c", ""])
    inputs = dict(token_lists=token_lists, tokens=tokens, empty_inside=empty_inside, placed=placed)
    return proc, got, inputs


def test_cpp_loader_runs_every_signature_like_python(every_signature_run, lm_export, model):
    """Every signature in TF Serving's C++ loader with the Keras model's numbers (the loader's run is shared with the
    `lm` test: `every_signature_run`)."""
    export_dir, _ = lm_export
    proc, got, inputs = every_signature_run
    token_lists, empty_inside, placed = inputs["token_lists"], inputs["empty_inside"], inputs["placed"]
    # the export holds TF Serving's warmup file (assets.extra/): the C++ loader loads the SavedModel beside it
    assert os.path.isfile(os.path.join(export_dir, "assets.extra", "tf_serving_warmup_requests"))
    expected = ex.reference_outputs(model, token_lists)
    stdout = proc.stdout.decode(errors="replace")
    assert proc.returncode == 0, stdout[-3000:] + proc.stderr.decode(errors="replace")[-3000:]
    for signature in ("default", "serving_default", "tokens", "packed"):  # packed: inputs of ones are valid
        assert f"warmup {signature}: ok" in stdout
    assert "run default on 2 sentence(s)" in stdout
    worst = 0.0
    for label in ("default", "serving_default", "tokens"):
        worst = max(worst, assert_close(expected, got[label], f"C++ {label} vs Keras"))
    # the same request through Python's loader: C++ and Python agree too
    loaded = tf.saved_model.load(export_dir)
    python = {
        k: v.numpy()
        for k, v in loaded.signatures["tokens"](
            tokens=tf.constant(empty_inside), sequence_len=tf.constant([3, 2])
        ).items()
    }
    worst = max(worst, assert_close(python, got["empty_inside"], "C++ vs Python, empty token inside the length"))
    # the internal `packed` signature (what the embedded server runs merged requests through): embed's activations
    want = activations_from_outputs(expected)
    for i, first in placed:
        n = len(token_lists[i])
        np.testing.assert_allclose(got["packed"]["activations"][0][:, first : first + n], want[i, :, :n], atol=ATOL)
        np.testing.assert_allclose(got["packed"]["elmo"][0][first : first + n], expected["elmo"][i, :n], atol=ATOL)
    for label in ("empty_batch", "empty_batch_tokens"):
        assert got[label]["elmo"].shape == (0, 0, 2 * model.config.projection_dim), label
        assert got[label]["sequence_len"].shape == (0,), label
    print(f"C++ loader parity: max |diff| {worst:.3g}")


@pytest.mark.slow
def test_cpp_loader_unicode_script_needs_the_tf_text_op_library(checker, model, tmp_path):
    pytest.importorskip("tensorflow_text", reason="tensorflow-text is not installed")
    export_dir = ex.export_elmo(model, str(tmp_path / "models" / "elmo"), tokenizer="unicode_script")
    sentences = [b"Hello, world! Aren't they?", b"", "naïve café.".encode()]
    expected = ex.reference_outputs(model, ex.reference_tokens(sentences, "unicode_script"))
    runs = [("default", "default", {"sentences": np.array(sentences, object)})]
    # without the op library the model loads, and the warm-up's first Run fails: that is why we warm up
    proc, _ = run_checker(checker, export_dir, tmp_path, runs)
    stderr = proc.stderr.decode(errors="replace")
    assert proc.returncode == 1
    assert "loaded " in proc.stdout.decode() and "warmup" not in proc.stdout.decode()
    assert "Op type not registered 'UnicodeScriptTokenizeWithOffsets'" in stderr, stderr[-3000:]
    library = tf_text_op_library()
    assert os.path.isfile(library), library
    proc, got = run_checker(checker, export_dir, tmp_path, runs, op_libraries=[library])
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    assert_close(expected, got["default"], "C++ unicode_script vs Keras")


def test_cpp_loader_catches_the_tf_module_trap(checker, model, tmp_path):
    """The check can fail: `tf.saved_model.save` of a tf.Module holding the Keras 3 model loads in Python but
    not in the C++ loader (tensorflow/serving#2226) -- the reason export uses keras.export.ExportArchive."""
    from elmo_tf.preprocessing import tokens_to_char_ids, whitespace_tokenize

    class Module(tf.Module):
        def __init__(self, elmo):
            super().__init__()
            self.elmo = elmo

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="sentences")])
        def default(self, sentences):
            tokens, _ = whitespace_tokenize(sentences)
            return {"elmo": self.elmo(tokens_to_char_ids(tokens))["elmo"]}

    module = Module(model)
    export_dir = tmp_path / "module" / "1"
    tf.saved_model.save(module, str(export_dir), signatures={"serving_default": module.default})
    assert tf.saved_model.load(str(export_dir)).signatures["serving_default"](sentences=tf.constant(["a b"]))[
        "elmo"
    ].shape == (1, 2, 2 * model.config.projection_dim)
    proc, _ = run_checker(checker, export_dir, tmp_path, [])
    assert proc.returncode == 1
    assert "Could not find variable" in proc.stderr.decode(errors="replace")


def test_cpp_loader_runs_the_lm_signature_like_python(every_signature_run, lm_export):
    """The `lm` signature (softmax + vocabulary, top k) loads and runs in TF Serving's C++ loader with the numbers of
    the in-process language model (the loader's run of `every_signature_run`)."""
    _, lm = lm_export
    proc, got, inputs = every_signature_run
    expected = lm.score_tokens(tf.constant(inputs["tokens"], tf.string))
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    assert "warmup lm: ok" in proc.stdout.decode()
    for key in ("forward_log_probs", "backward_log_probs", "forward_top_k_log_probs", "backward_top_k_log_probs"):
        np.testing.assert_allclose(got["lm"][key], expected[key].numpy(), atol=ATOL, rtol=0, err_msg=key)


@pytest.mark.parametrize("variant", ["word", "noword"])
@pytest.mark.slow
def test_cpp_loader_runs_a_converted_elmoformanylangs_model_like_python(checker, variant, tmp_path):
    """A converted ELMoForManyLangs model (its char vocabulary and word vocabulary are lookup tables in the graph):
    the C++ loader runs the sentence and token signatures with the Keras model's numbers (1e-5), scripts other than
    Latin, unknown chars, invalid UTF-8 and a token over 48 code points included."""
    from convert_testlib import converted_efml

    from elmo_tf.models import load_elmo

    model_dir = converted_efml(tmp_path / "converted", variant)
    model = load_elmo(model_dir / "options.json", model_dir / "weights.hdf5")
    export_dir = ex.export_elmo(model, str(tmp_path / "models" / "elmo"))
    sentences = SENTENCES + ["Мама мыла раму . 日本語 " + "ж" * 60, "<bos> Ёж"]
    token_lists = ex.reference_tokens(sentences)
    expected = ex.reference_outputs(model, token_lists)
    tokens, lengths = ex._pad(token_lists)
    runs = [
        ("default", "default", {"sentences": np.array([s.encode() if isinstance(s, str) else s for s in sentences])}),
        ("tokens", "tokens", {"tokens": tokens, "sequence_len": lengths}),
    ]
    proc, got = run_checker(checker, export_dir, tmp_path, runs)
    assert proc.returncode == 0, proc.stdout.decode(errors="replace")[-3000:] + proc.stderr.decode(errors="replace")
    worst = max(assert_close(expected, got[label], f"C++ {label} vs Keras") for label in ("default", "tokens"))
    print(f"C++ loader parity, converted ELMoForManyLangs ({variant}): max |diff| {worst:.3g}")


@pytest.mark.slow
def test_cpp_loader_runs_a_bfloat16_export_like_python(checker, model, tmp_path):
    """`export_elmo` of the test biLM computing in bfloat16 (`elmo-tf export --precision bfloat16`, issue 51): TF
    Serving's C++ loader loads it, replays its warmup file, and its sentence and token signatures give the bfloat16
    Keras model's numbers (1e-5), which are not float32's (above 1e-4 apart, below 0.1); every output stays float32."""
    bfloat16_model = load_test_model("bfloat16")
    export_dir = ex.export_elmo(bfloat16_model, str(tmp_path / "models" / "elmo"))
    token_lists = ex.reference_tokens(SENTENCES)
    tokens, lengths = ex._pad(token_lists)
    runs = [
        ("default", "default", {"sentences": np.array(SENTENCES, object)}),
        ("tokens", "tokens", {"tokens": tokens, "sequence_len": lengths}),
    ]
    proc, got = run_checker(checker, export_dir, tmp_path, runs)
    stdout = proc.stdout.decode(errors="replace")
    assert proc.returncode == 0, stdout[-3000:] + proc.stderr.decode(errors="replace")[-3000:]
    for signature in ("default", "serving_default", "tokens", "packed"):
        assert f"warmup {signature}: ok" in stdout
    expected = ex.reference_outputs(bfloat16_model, token_lists)
    for label in ("default", "tokens"):
        assert all(v.dtype == np.float32 for k, v in got[label].items() if k not in ("sequence_len", "mask")), label
        assert_close(expected, got[label], f"C++ {label} (bfloat16) vs Keras (bfloat16)")
    float32 = ex.reference_outputs(model, token_lists)
    worst = max(float(np.abs(got["default"][key] - float32[key]).max()) for key in ("word_emb", "elmo", "default"))
    assert 1e-4 < worst < 0.1, worst
