"""export/export_savedmodel.py: signatures, fresh-process parity (a bfloat16 export's too), versioning (concurrent
exports included), CLI (--precision, the metadata it records), saved_model_cli, a disk that refuses the export."""

import base64
import importlib.util
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import forked
import numpy as np
import pytest
import tensorflow as tf
from cli_testlib import assert_ends_with_one_error, run_limited
from export_testlib import load_test_model
from tiny_models import TINY

import elmo_tf.saved_model.export as ex
from elmo_tf.saved_model import contract, versions

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "export" / "export_savedmodel.py"

PYTHON = sys.executable
SAVED_MODEL_CLI = str(Path(sys.executable).parent / "saved_model_cli")
ATOL = 1e-5
LONG_TOKEN = "x" * 60  # cut to 48 bytes by the char mapping
SENTENCE_BYTES = [
    b"The cat sat on the mat .",
    b"Dogs are in the fog , aren't they ?",
    b"",
    b"   ",
    b"ELMo",
    "Zürich \t naïve  café\n!".encode(),
    b"bad \xff\xfe bytes " + LONG_TOKEN.encode(),  # invalid UTF-8 is mapped byte by byte
]


@pytest.fixture(scope="module")
def model():
    return load_test_model()


@pytest.fixture(scope="module")
def exported(model, tmp_path_factory):
    base = tmp_path_factory.mktemp("models") / "elmo"
    return ex.export_elmo(model, str(base))


@pytest.fixture(scope="module")
def bfloat16_model():
    """The test biLM computing in bfloat16 (issue 51): the same weights as `model`."""
    return load_test_model("bfloat16")


@pytest.fixture(scope="module")
def bfloat16_exported(bfloat16_model, tmp_path_factory):
    return ex.export_elmo(bfloat16_model, str(tmp_path_factory.mktemp("models") / "elmo_bf16"))


@pytest.fixture(scope="module")
def loaded(exported):
    """`exported` reloaded once with `tf.saved_model.load` for the tests that only read or call its signatures."""
    return tf.saved_model.load(exported)


@pytest.fixture(scope="module")
def tiny_model():
    """A tiny ELMo (Keras' seeded initializers) for the tests of versions, temporaries and the command line, which
    do not compare numbers with a reference: its exports take less time than the test biLM's."""
    import keras

    from elmo_tf import BiLMConfig, ELMo

    keras.utils.set_random_seed(0)
    return ELMo(BiLMConfig(**TINY))


@pytest.fixture(scope="module")
def tiny_model_dir(tiny_model, tmp_path_factory):
    """options.json + weights.hdf5 of `tiny_model` (an export of it takes seconds)."""
    from elmo_tf.models import save_elmo

    directory = tmp_path_factory.mktemp("tiny") / "model"
    save_elmo(tiny_model, str(directory))
    return directory


# A runner that imports only tensorflow (and tensorflow_text when a job asks): elmo_tf is made unimportable. It runs
# its jobs in order, so a job loading an export before tensorflow_text is imported sees what a process without it sees.
FRESH_RUNNER = textwrap.dedent("""
    import base64, json, os, sys
    sys.modules["elmo_tf"] = None  # any import of elmo_tf fails: the SavedModel must not need it
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf
    request = json.load(open(sys.argv[1]))
    for job in request["jobs"]:
        if job["tf_text"]:
            import tensorflow_text  # noqa: F401  (registers the tokenizer ops)
        try:
            loaded = tf.saved_model.load(job["export_dir"])
        except Exception as e:
            if not job["record_load_error"]:
                raise
            with open(os.path.join(request["out_dir"], job["name"] + ".load_error"), "w") as f:
                f.write("LOAD FAILED " + str(e))
            continue
        print("signatures", sorted(loaded.signatures))
        for run in job["runs"]:
            inputs = {}
            for key, spec in run["inputs"].items():
                if spec["dtype"] == "string":
                    values = [base64.b64decode(v) for v in spec["values"]]
                    inputs[key] = tf.reshape(tf.constant(values, tf.string), spec["shape"])
                else:
                    inputs[key] = tf.constant(np.array(spec["values"], spec["dtype"]).reshape(spec["shape"]))
            out = loaded.signatures[run["signature"]](**inputs)
            path = os.path.join(request["out_dir"], run["label"] + ".npz")
            np.savez(path, **{k: v.numpy() for k, v in out.items()})
    assert not any(name.startswith("elmo_tf") and sys.modules[name] is not None for name in sys.modules)
    print("fresh process ok")
""")


def string_input(array):
    array = np.asarray(array, dtype=object)
    return {
        "dtype": "string",
        "shape": list(array.shape),
        "values": [base64.b64encode(bytes(v)).decode() for v in array.reshape(-1)],
    }


def int_input(array):
    array = np.asarray(array, np.int32)
    return {"dtype": "int32", "shape": list(array.shape), "values": array.reshape(-1).tolist()}


def fresh_job(name, export_dir, runs=(), tf_text=False, record_load_error=False):
    """A job of the fresh process: load `export_dir` (after `import tensorflow_text` when `tf_text`; a failed load is
    written to `<name>.load_error` when `record_load_error`, else it fails the process), then `runs`
    ([label, signature, inputs])."""
    return {
        "name": name,
        "export_dir": str(export_dir),
        "tf_text": tf_text,
        "record_load_error": record_load_error,
        "runs": [{"label": label, "signature": sig, "inputs": inputs} for label, sig, inputs in runs],
    }


def run_fresh(jobs, tmp_path):
    """Runs `jobs` (`fresh_job`) in order in one new Python process; returns `{label: outputs}` of every run and
    `{name: message}` of every recorded load error."""
    out_dir = tmp_path / "fresh_out"
    out_dir.mkdir(exist_ok=True)
    (tmp_path / "request.json").write_text(json.dumps({"out_dir": str(out_dir), "jobs": jobs}))
    (tmp_path / "runner.py").write_text(FRESH_RUNNER)
    proc = subprocess.run(
        [PYTHON, str(tmp_path / "runner.py"), str(tmp_path / "request.json")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "fresh process ok" in proc.stdout
    outputs = {run["label"]: dict(np.load(out_dir / f"{run['label']}.npz")) for job in jobs for run in job["runs"]}
    errors = {p.stem: p.read_text() for p in out_dir.glob("*.load_error")}
    return outputs, errors


def assert_close(expected, actual, what):
    diffs = ex.compare_outputs(expected, actual)
    for key, diff in diffs.items():
        limit = ATOL if np.asarray(expected[key]).dtype.kind == "f" else 0
        assert diff <= limit, f"{what}: output {key!r} differs by {diff} (limit {limit}); all: {diffs}"
    return max(diffs.values(), default=0.0)


def keras_reference(model, token_lists):
    return ex.reference_outputs(model, token_lists)


def test_output_keys_follow_the_serving_contract():
    assert contract.output_keys(2) == [
        "word_emb",
        "lstm_outputs1",
        "lstm_outputs2",
        "elmo",
        "default",
        "sequence_len",
        "mask",
    ]


def test_signatures_and_specs(loaded, model):
    assert {"default", "serving_default", "tokens"} <= set(loaded.signatures)
    keys = set(contract.output_keys(model.config.num_layers))
    p = model.config.projection_dim
    for name in ("default", "serving_default", "tokens"):
        fn = loaded.signatures[name]
        assert set(fn.structured_outputs) == keys, name
        outs = fn.structured_outputs
        assert outs["word_emb"].shape.as_list() == [None, None, p]
        assert outs["elmo"].shape.as_list() == [None, None, 2 * p]
        assert outs["default"].shape.as_list() == [None, 2 * p]
        assert outs["mask"].dtype == tf.bool and outs["mask"].shape.as_list() == [None, None]
        assert outs["sequence_len"].dtype == tf.int32
    _, sentences_spec = loaded.signatures["default"].structured_input_signature
    assert sentences_spec == {"sentences": tf.TensorSpec([None], tf.string, name="sentences")}
    _, tokens_spec = loaded.signatures["tokens"].structured_input_signature
    assert tokens_spec == {
        "tokens": tf.TensorSpec([None, None], tf.string, name="tokens"),
        "sequence_len": tf.TensorSpec([None], tf.int32, name="sequence_len"),
    }


def test_packed_signature_computes_embeds_activations(exported, loaded, model):
    """The internal `packed` signature: a batch of one packed call (leading axis 1), and its activations and mix at
    every sentence's positions are the Keras model's (`check_export` compares them too)."""
    _, specs = loaded.signatures["packed"].structured_input_signature
    assert specs == {
        "tokens": tf.TensorSpec([1, None], tf.string, name="tokens"),
        "table_rows": tf.TensorSpec([1, None, None], tf.int32, name="table_rows"),
        "starts": tf.TensorSpec([1, None, None], tf.bool, name="starts"),
    }
    token_lists = ex.reference_tokens(["the cat sat", "", "the cat", "Zürich , naïve café !", "x " * 80])
    diffs = ex.check_packed(loaded.signatures["packed"], token_lists, keras_reference(model, token_lists))
    assert max(diffs.values()) <= ATOL, diffs
    assert set(ex.check_export(model, exported)) == {"default", "serving_default", "tokens", "packed"}
    ones = loaded.signatures["packed"](  # a synthetic warm-up's inputs (ones): one <S>, no token
        tokens=tf.constant([[b"a"]]), table_rows=tf.ones([1, 1, 1], tf.int32), starts=tf.ones([1, 1, 1], tf.bool)
    )
    assert ones["activations"].shape == (1, model.num_output_layers, 0, 2 * model.config.projection_dim)


def test_no_packed_signature_for_a_per_sentence_layer_norm_mix(tmp_path):
    """A mix with per-sentence layer norm cannot be applied to packed positions: no `packed` signature (its merged
    requests keep the padded path) and no packed warmup request."""
    import keras

    from elmo_tf import BiLMConfig, ELMo

    keras.utils.set_random_seed(0)
    model = ELMo(BiLMConfig(**TINY), mix_layer_norm=True)
    assert not contract.packable(model)
    export_dir = ex.export_elmo(model, str(tmp_path / "elmo"))
    assert "packed" not in tf.saved_model.load(export_dir).signatures


def parity_inputs():
    """The token lists of SENTENCE_BYTES, and the `tokens` inputs of the fresh-process runs: `junk` (padding replaced
    by tokens beyond sequence_len), `wide` (two more columns), `empty_inside` (an empty token inside the length)."""
    token_lists = ex.reference_tokens(SENTENCE_BYTES)
    tokens, lengths = ex._pad(token_lists)
    junk = np.where(tokens == b"", b"junk", tokens)  # beyond sequence_len: must be ignored
    wide = np.concatenate([junk, np.full([len(junk), 2], b"more", object)], axis=1)  # extra columns: zeros there
    empty_inside = np.array([[b"a", b"", b"b"], [b"c", b"d", b"x"]], object)
    return token_lists, lengths, junk, wide, empty_inside


def parity_runs():
    _, lengths, junk, wide, empty_inside = parity_inputs()
    return [
        ("default", "default", {"sentences": string_input(SENTENCE_BYTES)}),
        ("serving_default", "serving_default", {"sentences": string_input(SENTENCE_BYTES)}),
        ("tokens", "tokens", {"tokens": string_input(junk), "sequence_len": int_input(lengths)}),
        ("tokens_wide", "tokens", {"tokens": string_input(wide), "sequence_len": int_input(lengths)}),
        ("single", "default", {"sentences": string_input([SENTENCE_BYTES[1]])}),
        ("empty_inside", "tokens", {"tokens": string_input(empty_inside), "sequence_len": int_input([3, 2])}),
        ("empty_batch", "default", {"sentences": string_input(np.zeros([0], object))}),
        (
            "empty_batch_tokens",
            "tokens",
            {"tokens": string_input(np.zeros([0, 0], object)), "sequence_len": int_input(np.zeros([0]))},
        ),
        ("all_empty", "default", {"sentences": string_input([b"", b" \t "])}),
    ]


UNICODE_SENTENCES = [b"Hello, world! Aren't they?", b"", "naïve café.".encode()]


@pytest.fixture(scope="module")
def fresh_process_outputs(exported, request, tmp_path_factory):
    """ONE process that imports only tensorflow (elmo_tf unimportable) answers the fresh-process tests, in this
    order: it loads the unicode_script export before `import tensorflow_text` (the load must fail:
    test_unicode_script_export_needs_tf_text_ops), runs the whitespace export's signatures
    (test_fresh_process_parity) and the bfloat16 export's (test_a_bfloat16_export_loads_in_a_fresh_process), then
    imports tensorflow_text and runs the unicode_script export (test_unicode_script_export_fresh_process). Without
    tensorflow-text only the whitespace jobs run (the two unicode_script tests skip). Returns `({label: outputs},
    {job name: load error})`. The bfloat16 export is made and run only where its test is selected (`slow`)."""
    jobs = []
    unicode_path = None
    if importlib.util.find_spec("tensorflow_text") is not None:
        unicode_path = request.getfixturevalue("unicode_script_export")
        jobs.append(fresh_job("unicode_without_tf_text", unicode_path, record_load_error=True))
    jobs.append(fresh_job("whitespace", exported, parity_runs()))
    if any(item.originalname == "test_a_bfloat16_export_loads_in_a_fresh_process" for item in request.session.items):
        runs = [(f"bf16_{label}", *run) for label, *run in parity_runs()]
        jobs.append(fresh_job("bfloat16", request.getfixturevalue("bfloat16_exported"), runs))
    if unicode_path is not None:
        runs = [("unicode_script_default", "default", {"sentences": string_input(UNICODE_SENTENCES)})]
        jobs.append(fresh_job("unicode_with_tf_text", unicode_path, runs, tf_text=True))
    return run_fresh(jobs, tmp_path_factory.mktemp("fresh_process"))


@pytest.mark.slow
def test_fresh_process_parity(fresh_process_outputs, model):
    """Loaded by a process that imports only tensorflow: both signatures equal the Keras model within 1e-5 (the
    process is shared with the unicode_script tests: `fresh_process_outputs`)."""
    token_lists, _, _, _, empty_inside = parity_inputs()
    assert token_lists[5] == ["Zürich".encode(), "naïve".encode(), "café".encode(), b"!"]
    assert token_lists[2] == [] and token_lists[3] == []
    expected = keras_reference(model, token_lists)
    got, _ = fresh_process_outputs
    worst = 0.0
    for label in ("default", "serving_default", "tokens"):
        worst = max(worst, assert_close(expected, got[label], label))
    wide_out = got["tokens_wide"]
    for key, value in expected.items():  # two more columns: same values, then zeros / False
        if value.ndim == 3 or key == "mask":
            np.testing.assert_allclose(wide_out[key][:, : value.shape[1]], value, atol=ATOL, err_msg=key)
            assert not np.any(wide_out[key][:, value.shape[1] :]), key
        else:
            np.testing.assert_allclose(wide_out[key], value, atol=ATOL, err_msg=key)
    # a sentence alone gives the same vectors as in the batch (stateless, padding-invariant)
    single = keras_reference(model, [token_lists[1]])
    worst = max(worst, assert_close(single, got["single"], "single"))
    np.testing.assert_allclose(got["single"]["elmo"][0], expected["elmo"][1, : len(token_lists[1])], atol=ATOL)
    # "" inside sequence_len is a token without characters; beyond it, "x" is ignored
    ids = contract.tokens_char_ids(tf.constant(empty_inside, tf.string), tf.constant([3, 2]))
    inside = {k: np.asarray(v) for k, v in contract.elmo_outputs(model, ids).items()}
    worst = max(worst, assert_close(inside, got["empty_inside"], "empty_inside"))
    np.testing.assert_array_equal(got["empty_inside"]["sequence_len"], [3, 2])
    np.testing.assert_array_equal(got["empty_inside"]["mask"], [[True, True, True], [True, True, False]])
    # empty batch: batch 0 in every output; empty sentences: length 0 and zeros
    two_p = 2 * model.config.projection_dim
    for label in ("empty_batch", "empty_batch_tokens"):
        out = got[label]
        assert out["elmo"].shape == (0, 0, two_p) and out["default"].shape == (0, two_p), label
        assert out["sequence_len"].shape == (0,) and out["mask"].shape == (0, 0), label
    out = got["all_empty"]
    assert out["elmo"].shape == (2, 0, two_p)
    np.testing.assert_array_equal(out["sequence_len"], [0, 0])
    np.testing.assert_array_equal(out["default"], np.zeros([2, two_p], np.float32))
    print(f"fresh-process parity: max |diff| {worst:.3g}")


@pytest.mark.slow
def test_a_bfloat16_export_loads_in_a_fresh_process(fresh_process_outputs, bfloat16_model, model, bfloat16_exported):
    """`export_elmo` of a model computing in bfloat16 (issue 51): a process that imports only tensorflow loads it and
    gets the bfloat16 Keras model's numbers (1e-5: the graph holds the bfloat16 weights and computes as the model
    does), which differ from float32's by bfloat16's rounding (above 1e-4, below 0.1); every output stays float32,
    and the export's metadata says bfloat16."""
    from elmo_tf.saved_model.metadata import read_export_metadata

    token_lists = parity_inputs()[0]
    expected = keras_reference(bfloat16_model, token_lists)
    float32 = keras_reference(model, token_lists)
    got, _ = fresh_process_outputs
    for label in ("default", "serving_default", "tokens", "single", "empty_batch", "all_empty"):
        out = got[f"bf16_{label}"]
        assert all(v.dtype == np.float32 for k, v in out.items() if k not in ("sequence_len", "mask")), label
    for label in ("default", "serving_default", "tokens"):
        assert_close(expected, got[f"bf16_{label}"], f"bfloat16 {label}")
    worst = max(float(np.abs(got["bf16_default"][k] - float32[k]).max()) for k in ("word_emb", "elmo", "default"))
    assert 1e-4 < worst < 0.1, worst
    metadata = read_export_metadata(bfloat16_exported)
    assert (metadata["exporter"], metadata["precision"], metadata["tokenizer"]) == ("elmo", "bfloat16", "whitespace")


def test_tokens_signature_rejects_inconsistent_lengths(loaded):
    fn = loaded.signatures["tokens"]
    tokens = tf.constant([["a", "b"]])
    for lengths, message in (
        ([3], "sequence_len must be <= the width of tokens"),
        ([-1], "sequence_len must be >= 0"),
        ([1, 1], "sequence_len must have one entry per row of tokens"),
    ):
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            fn(tokens=tokens, sequence_len=tf.constant(lengths, tf.int32))


@pytest.mark.slow
def test_max_tokens_cuts_both_signatures(model, tmp_path):
    path = ex.export_elmo(model, str(tmp_path / "elmo"), max_tokens=3)
    loaded = tf.saved_model.load(path)
    sentences = ["a b c d e", "f g"]
    expected = keras_reference(model, [[b"a", b"b", b"c"], [b"f", b"g"]])
    assert_close(
        expected,
        {k: v.numpy() for k, v in loaded.signatures["default"](sentences=tf.constant(sentences)).items()},
        "default max_tokens",
    )
    out = loaded.signatures["tokens"](
        tokens=tf.constant([["a", "b", "c", "d", "e"], ["f", "g", "", "", ""]]), sequence_len=tf.constant([5, 2])
    )
    assert_close(expected, {k: v.numpy() for k, v in out.items()}, "tokens max_tokens")


# ------------------------------------------------------------------------------------------------ unicode_script


@pytest.fixture(scope="module")
def unicode_script_export(model, tmp_path_factory):
    pytest.importorskip("tensorflow_text", reason="tensorflow-text is not installed")
    return ex.export_elmo(model, str(tmp_path_factory.mktemp("models") / "elmo"), tokenizer="unicode_script")


@pytest.mark.slow
def test_unicode_script_export_fresh_process(model, unicode_script_export, fresh_process_outputs):
    """A fresh process that imports tensorflow_text runs the unicode_script export as the Keras model (the process of
    `fresh_process_outputs`)."""
    token_lists = ex.reference_tokens(UNICODE_SENTENCES, "unicode_script")
    assert token_lists[0] == [b"Hello", b",", b"world", b"!", b"Aren", b"'", b"t", b"they", b"?"]
    expected = keras_reference(model, token_lists)
    got, _ = fresh_process_outputs
    assert_close(expected, got["unicode_script_default"], "unicode_script default")


@pytest.mark.slow
def test_unicode_script_export_needs_tf_text_ops(unicode_script_export, fresh_process_outputs):
    """Documented: without `import tensorflow_text` a fresh process cannot load the unicode_script export (the load
    before the import in the process of `fresh_process_outputs`)."""
    _, errors = fresh_process_outputs
    message = errors.get("unicode_without_tf_text", "")
    assert "LOAD FAILED" in message and "UnicodeScriptTokenizeWithOffsets" in message, errors


# ------------------------------------------------------------------------------------------------ versioning


def test_versions_count_up_and_are_never_overwritten(tiny_model, tmp_path):
    base = tmp_path / "elmo"
    base.mkdir()
    (base / "notes").mkdir()  # non-integer names are not versions
    first = ex.export_elmo(tiny_model, str(base), check=False)
    assert first == str(base / "1")
    second = ex.export_elmo(tiny_model, str(base), check=False)
    assert second == str(base / "2")
    assert versions.existing_versions(str(base)) == [1, 2] and versions.next_version(str(base)) == 3
    mode = stat.S_IMODE(os.stat(second).st_mode)
    assert mode & 0o005 == 0o005 & ~_umask(), f"version directory mode {oct(mode)} hides it from other users"
    before = sorted(os.listdir(second))
    with pytest.raises(FileExistsError, match="version 2 already exists"):
        ex.export_elmo(tiny_model, str(base), version=2, check=False)
    assert sorted(os.listdir(second)) == before
    assert ex.export_elmo(tiny_model, str(base), version=10, check=False) == str(base / "10")
    assert versions.next_version(str(base)) == 11
    assert sorted(os.listdir(base)) == ["1", "10", "2", "notes"]  # no temporary directory left


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_failed_export_leaves_nothing(tiny_model, tmp_path, monkeypatch):
    base = tmp_path / "elmo"

    def broken_check(*args, **kwargs):
        raise ex.ExportError("simulated parity failure")

    monkeypatch.setattr(ex, "check_export", broken_check)
    with pytest.raises(ex.ExportError, match="simulated"):
        ex.export_elmo(tiny_model, str(base / "deeper"))
    assert os.listdir(tmp_path) == []  # the base (and its parent) it created are gone again
    base.mkdir()
    with pytest.raises(ex.ExportError, match="simulated"):
        ex.export_elmo(tiny_model, str(base))
    assert os.listdir(base) == []  # neither a version nor a temporary directory; a base that existed stays
    with pytest.raises(ValueError, match="tokenizer"):
        ex.export_elmo(tiny_model, str(base), tokenizer="spaces")
    with pytest.raises(ValueError, match="version"):
        ex.export_elmo(tiny_model, str(base), version=0)
    with pytest.raises(ValueError, match="version"):
        ex.export_elmo(tiny_model, str(tmp_path / "new"), version=2**63)
    with pytest.raises(ValueError, match="max_tokens"):
        ex.export_elmo(tiny_model, str(base), max_tokens=0)
    assert os.listdir(base) == [] and os.listdir(tmp_path) == ["elmo"]


def test_check_export_detects_a_different_model(model, exported):
    """The parity check can fail: a model with one changed weight does not match the export."""
    other = load_test_model()
    other.scalar_mixes[0].gamma.assign(other.scalar_mixes[0].gamma * 2.0)
    with pytest.raises(ex.ExportError, match="differ"):
        ex.check_export(other, exported)


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_check_export_allows_a_bfloat16_packed_signature_its_rounding_and_no_more(precision, tmp_path, monkeypatch):
    """The packed signature of a bfloat16 model groups its products differently from the padded path, so its outputs
    may differ by bfloat16's rounding: `check_export` allows it `PACKED_BFLOAT16_BOUND` (1%) of the largest output
    value, and float32's packed signature, and every padded signature, 1e-5. A difference of half that bound passes
    in bfloat16 only; one of twice the bound (a broken signature) fails in both, naming the signature and its bound."""
    import keras

    from elmo_tf import BiLMConfig, ELMo

    keras.utils.set_random_seed(0)
    model = ELMo(BiLMConfig(**TINY), precision=precision)
    export_dir = ex.export_elmo(model, str(tmp_path / "elmo"), check=False)
    expected = ex.reference_outputs(model, ex.reference_tokens(ex.CHECK_SENTENCES))
    bound = ex.PACKED_BFLOAT16_BOUND * max(float(np.abs(v).max()) for v in expected.values() if v.dtype.kind == "f")
    assert bound > 10 * ATOL
    for diff in (0.5 * bound, 2 * bound):
        monkeypatch.setattr(ex, "check_packed", lambda *args, diff=diff: {"activations": diff, "elmo": 0.0})
        if precision == "bfloat16" and diff < bound:
            assert ex.check_export(model, export_dir)["packed"]["activations"] == diff
            continue
        allowed = f"{bound:.3g}" if precision == "bfloat16" else "1e-05"
        with pytest.raises(ex.ExportError, match=rf"\(allowed: packed {allowed}\): {{'packed/activations'"):
            ex.check_export(model, export_dir)


@pytest.mark.slow
def test_an_original_size_bfloat16_export_passes_its_own_check(tmp_path):
    """`elmo-tf export --precision bfloat16` of the original-size model (seeded random weights): its packed signature
    is more than 1e-5 from the Keras model (bfloat16's rounding of differently grouped products: the check refused
    the export before PACKED_BFLOAT16_BOUND), within the bound, and the padded signatures within 1e-5."""
    import keras

    from elmo_tf import ELMo
    from elmo_tf.config import get_config

    keras.utils.set_random_seed(0)
    model = ELMo(get_config("original"), precision="bfloat16")
    export_dir = ex.export_elmo(model, str(tmp_path / "elmo"))
    results = ex.check_export(model, export_dir)  # raises beyond the bounds
    assert max(results["packed"].values()) > ATOL, results["packed"]
    assert max(d for sig, diffs in results.items() if sig != "packed" for d in diffs.values()) <= ATOL, results


# ------------------------------------------------------------------------------------------------ CLI


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--output", "o", "--options", "x.json"], "--weights: required"),
        (["--output", "o", "--weights", "w.hdf5"], "--options: required"),
        (["--output", "o", "--options", "missing.json", "--weights", "w.hdf5"], "--options: no such file"),
        (["--output", "o", "--model-dir", "/nonexistent"], "--model-dir: not a directory"),
        (["--output", "o", "--model-dir", ".", "--version", "0"], "argument --version"),
        (["--output", "o", "--model-dir", ".", "--version", str(2**63)], "<= 9223372036854775807"),
        (
            ["--output", "o", "--model-dir", ".", "--version", "99999999999999999999"],
            "--version must be <= 9223372036854775807 (int64), got",
        ),
        (["--output", "o", "--model-dir", ".", "--max-tokens", "-3"], "argument --max-tokens"),
        (
            ["--output", "o", "--model-dir", ".", "--max-tokens", str(2**31)],
            "--max-tokens must be <= 2147483647 (int32), got",
        ),
        (["--output", "o", "--model-dir", ".", "--tokenizer", "spaces"], "argument --tokenizer"),
        (["--output", "o", "--model-dir", ".", "--precision", "fp16"], "argument --precision: invalid choice: 'fp16'"),
        (["--model-dir", "."], "--output"),
    ],
)
def test_bad_arguments_give_one_line(argv, message, run_script):
    code, _, err = run_script(SCRIPT, argv)
    assert code == 2
    assert err.count("\n") == 1 and message in err and "Traceback" not in err, err


def test_help_has_examples():
    proc = subprocess.run([PYTHON, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0
    for text in ("examples:", "--model-dir", "import tensorflow_text", "--max-tokens", "serving_default"):
        assert text in proc.stdout, text


@pytest.mark.parametrize("precision", [None, "bfloat16"])
@pytest.mark.slow
def test_script_end_to_end_with_model_dir(tiny_model_dir, tmp_path, precision):
    """--precision reaches the export (its check compares it with the model computing in that precision) and its
    metadata (float32 without the flag)."""
    from elmo_tf.saved_model.metadata import read_export_metadata

    base = tmp_path / "models" / "elmo"
    cmd = [
        PYTHON,
        str(SCRIPT),
        "--model-dir",
        str(tiny_model_dir),
        "--output",
        str(base),
        "--version",
        "7",
        *(("--precision", precision) if precision else ()),
    ]
    proc = forked.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == str(base / "7")
    assert "parity ok" in proc.stderr
    computed = precision or "float32"
    assert f"to compute in {computed}" in proc.stderr
    assert read_export_metadata(str(base / "7"))["precision"] == computed


def test_script_refuses_an_existing_version(tiny_model_dir, tmp_path, run_script):
    (tmp_path / "elmo" / "7").mkdir(parents=True)
    code, _, err = run_script(SCRIPT, ["--model-dir", tiny_model_dir, "--output", tmp_path / "elmo", "--version", "7"])
    assert code == 2
    assert "--version: version 7 already exists" in err and err.count("\n") == 1
    assert os.listdir(tmp_path / "elmo" / "7") == []


# ------------------------------------------------------------------------------------------------ saved_model_cli


@pytest.mark.skipif(not os.path.exists(SAVED_MODEL_CLI), reason="saved_model_cli is not in the venv")
def test_saved_model_cli_show_and_run(exported):
    """The venv's saved_model_cli script, run by this interpreter (its shebang's) through the fork server."""
    show = forked.run(
        [PYTHON, SAVED_MODEL_CLI, "show", "--dir", exported, "--all"], capture_output=True, text=True, timeout=300
    )
    assert show.returncode == 0, show.stderr[-2000:]
    for signature in ("default", "serving_default", "tokens"):
        assert f"signature_def['{signature}']" in show.stdout
    for output in ("word_emb", "lstm_outputs1", "lstm_outputs2", "elmo", "sequence_len", "mask"):
        assert f"outputs['{output}']" in show.stdout
    run = forked.run(
        [
            PYTHON,
            SAVED_MODEL_CLI,
            "run",
            "--dir",
            exported,
            "--tag_set",
            "serve",
            "--signature_def",
            "default",
            "--input_exprs",
            'sentences=["a b c"]',
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "Result for output key elmo" in run.stdout
    assert "Result for output key sequence_len:\n[3]" in run.stdout


# ------------------------------------------------------------------------------------------------ interrupted exports


def _wait_for_temp(base, proc, seconds=240):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        temps = [n for n in os.listdir(base) if ".tmp-" in n] if base.is_dir() else []
        if temps and any(os.listdir(base / t) for t in temps):  # the SavedModel is being written
            return temps
        time.sleep(0.05)
    raise AssertionError(f"no temporary export directory appeared (exit {proc.poll()})")


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
@pytest.mark.slow
def test_a_killed_export_publishes_nothing_and_its_temporary_goes(tiny_model, tiny_model_dir, tmp_path, how):
    """kill -9 leaves the hidden temporary, which the next export to the same base removes; SIGTERM removes it
    itself and exits 143. Neither publishes a version."""
    base = tmp_path / "elmo"
    proc = forked.Popen(
        [PYTHON, str(SCRIPT), "--model-dir", str(tiny_model_dir), "--output", str(base)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        temps = _wait_for_temp(base, proc)
        proc.send_signal(getattr(signal, how))
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert all(name.startswith(".") and not name.isdigit() for name in temps)  # hidden, never a version name
    if how == "SIGTERM":
        assert proc.returncode == 143, err[-2000:]
        assert not base.exists() and "Traceback" not in err  # the base it created is removed with its temporary
    else:
        assert proc.returncode == -signal.SIGKILL
        assert sorted(os.listdir(base)) == sorted(temps)  # left behind, hidden: a model server ignores it
    path = ex.export_elmo(tiny_model, str(base), check=False)
    assert os.listdir(base) == ["1"] and path == str(base / "1")


def test_a_live_exports_temporary_is_kept(tiny_model, tmp_path):
    base = tmp_path / "elmo"
    live = base / f".1.tmp-{os.getpid()}-0123abcd"  # this process: alive
    dead = base / ".5.tmp-999999999-0123abcd"  # no such process
    live.mkdir(parents=True)
    dead.mkdir()
    ex.export_elmo(tiny_model, str(base), version=2, check=False)
    assert sorted(os.listdir(base)) == sorted(["2", live.name])


def test_versions_are_numbered_as_the_model_server_reads_them(tmp_path):
    """Export and server share `parse_version`: "007" is version 7 (not overwritten under the name "7"), an overflowing
    name is no version (the next one is not 10**20 + 1, which no server would load)."""
    base = tmp_path / "elmo"
    for name in ("007", "99999999999999999999", "notes"):
        (base / name).mkdir(parents=True)
    assert versions.existing_versions(str(base)) == [7] and versions.next_version(str(base)) == 8
    with pytest.raises(FileExistsError):
        versions.publish_version(str(base), 7, lambda tmp: None)
    with pytest.raises(ValueError, match="2\\*\\*63"):
        versions.publish_version(str(base), 2**63, lambda tmp: None)
    assert versions.publish_version(str(base), None, lambda tmp: None) == str(base / "8")
    (base / str(2**63 - 1)).mkdir()
    with pytest.raises(ex.ExportError, match="no version number is left"):
        versions.publish_version(str(base), None, lambda tmp: None)
    assert sorted(os.listdir(base)) == sorted(["007", "8", "99999999999999999999", "notes", str(2**63 - 1)])


# ------------------------------------------------------------------------------------------------ concurrent exports


def _fill(content):
    def write(tmp):
        Path(tmp, "saved_model.pb").write_bytes(content)

    return write


def test_an_export_published_meanwhile_gets_its_version_and_this_one_the_next(tmp_path):
    """The version is taken when the export is published, not when it starts: a later export that finishes first
    keeps version 1, this one becomes 2 (before: both chose 1 and this one failed with "version 1 exists")."""
    base = tmp_path / "elmo"

    def slow(tmp):
        _fill(b"slow")(tmp)
        assert versions.publish_version(str(base), None, _fill(b"fast")) == str(base / "1")

    assert versions.publish_version(str(base), None, slow) == str(base / "2")
    assert (base / "1" / "saved_model.pb").read_bytes() == b"fast"
    assert (base / "2" / "saved_model.pb").read_bytes() == b"slow"
    assert sorted(os.listdir(base)) == ["1", "2"]


def test_a_version_taken_between_the_check_and_the_rename_is_skipped(tmp_path, monkeypatch):
    """Another export's rename lands on the chosen number just before this one's: renaming onto a non-empty directory
    fails, so the claim is exclusive; the next number is tried and the other export's files are untouched."""
    base = tmp_path / "elmo"
    (base / "4").mkdir(parents=True)
    (base / "4" / "saved_model.pb").write_bytes(b"four")
    real_rename, calls = os.rename, []

    def racing_rename(src, dst):
        calls.append(os.path.basename(dst))
        if len(calls) == 1:  # the other export wins the race for this number
            os.mkdir(dst)
            Path(dst, "saved_model.pb").write_bytes(b"other")
        return real_rename(src, dst)

    monkeypatch.setattr(os, "rename", racing_rename)
    assert versions.publish_version(str(base), None, _fill(b"mine")) == str(base / "6")
    assert calls == ["5", "6"]
    assert [(base / v / "saved_model.pb").read_bytes() for v in ("4", "5", "6")] == [b"four", b"other", b"mine"]
    assert sorted(os.listdir(base)) == ["4", "5", "6"]


def test_an_explicit_version_taken_meanwhile_is_refused_and_nothing_is_left(tmp_path):
    base = tmp_path / "elmo"

    def slow(tmp):
        _fill(b"slow")(tmp)
        versions.publish_version(str(base), 3, _fill(b"fast"))

    with pytest.raises(FileExistsError, match="version 3 already exists"):
        versions.publish_version(str(base), 3, slow)
    assert os.listdir(base) == ["3"] and (base / "3" / "saved_model.pb").read_bytes() == b"fast"


@pytest.mark.slow
def test_two_exports_at_once_into_one_base_both_publish(tiny_model_dir, tmp_path):
    base = tmp_path / "models" / "elmo"
    procs = [
        forked.Popen(
            [PYTHON, str(SCRIPT), "--model-dir", str(tiny_model_dir), "--output", str(base)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=600)
            results.append((proc.returncode, out.strip(), err))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    for code, _, err in results:
        assert code == 0, err[-3000:]
        assert "Traceback" not in err and "parity ok" in err, err[-3000:]
    assert sorted(out for _, out, _ in results) == [str(base / "1"), str(base / "2")]
    assert sorted(os.listdir(base)) == ["1", "2"]
    for version in ("1", "2"):
        loaded = tf.saved_model.load(str(base / version))
        assert set(contract.SIGNATURES) <= set(loaded.signatures)


def test_an_overflowing_version_is_refused_before_anything_loads(tiny_model_dir, tmp_path):
    base = tmp_path / "models" / "elmo"
    proc = forked.run(
        [PYTHON, str(SCRIPT), "--model-dir", str(tiny_model_dir), "--output", str(base), "--version", "9" * 20],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("export_savedmodel.py: error: argument --version:")
    assert "loading" not in proc.stderr  # refused before the model loads
    assert not (tmp_path / "models").exists()


# ------------------------------------------------------------------------------------------------ a full disk


@pytest.mark.slow
def test_a_full_disk_publishes_nothing_and_ends_with_one_line(tiny_model_dir, tmp_path):
    """A file-size limit below the SavedModel's size (EFBIG, as a full disk gives ENOSPC): exit 1 with one line naming
    the base and the error; no temporary, no version; a new base is removed again, an existing one is as it was."""
    for base, existing in ((tmp_path / "new" / "elmo", False), (tmp_path / "old", True)):
        if existing:
            (base / "1").mkdir(parents=True)
            (base / "1" / "saved_model.pb").write_bytes(b"version 1")
        args = [SCRIPT, "--model-dir", tiny_model_dir, "--output", base, "--no-check"]
        result = run_limited(args, 100_000, timeout=300)
        assert_ends_with_one_error(result, 1, "--output", f"cannot write {str(base)!r}", "File too large")
        if existing:
            assert os.listdir(base) == ["1"] and (base / "1" / "saved_model.pb").read_bytes() == b"version 1"
        else:
            assert not (tmp_path / "new").exists()


def test_the_export_encodes_each_distinct_token_once(loaded):
    """The signatures run `ELMo.call`, so the char CNN goes through `CharCNN.encode_distinct` (a UniqueV2 over the
    char-id rows) in the SavedModel too; test_fresh_process_parity checks its outputs against Keras."""
    for name in contract.SIGNATURES:
        graph = loaded.signatures[name].graph.as_graph_def()
        ops = {node.op for node in graph.node} | {n.op for f in graph.library.function for n in f.node_def}
        assert "UniqueV2" in ops, name
