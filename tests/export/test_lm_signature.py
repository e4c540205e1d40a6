"""The `lm` signature of an export (elmo_tf/saved_model/export.py, elmo_tf/saved_model/contract.py,
elmo_tf/cli/export.py): written when a softmax and its vocabulary are given, equal to the in-process
`LanguageModel`, served by the embedded server's servable (merged calls included) with its cost in the request
budget."""

import h5py
import numpy as np
import pytest
import tensorflow as tf
from export_testlib import load_test_model
from tiny_models import randomize_weights

import elmo_tf.saved_model.export as ex
from elmo_tf.cli import run
from elmo_tf.cli.export import main as export_main
from elmo_tf.models import load_language_model
from elmo_tf.serving.batching.merge import run_batch
from elmo_tf.serving.limits.budget import Limits
from elmo_tf.serving.servable import load_servable
from elmo_tf.serving.serving_error import ServingError

WORDS = ["<S>", "</S>", "<UNK>"] + "The cat sat on the mat . Dogs are in fog , they ? ELMo".split()
TOP_K = 3
ATOL = 1e-5
KEYS = ["forward_log_probs", "backward_log_probs"] + [
    f"{d}_top_k_{p}" for d in ("forward", "backward") for p in ("words", "log_probs")
]


@pytest.fixture(scope="module")
def model():
    """The test biLM as loaded (the `exported` fixture loads and randomizes its own copy)."""
    return load_test_model()


@pytest.fixture(scope="module")
def lm_files(model, tmp_path_factory):
    d = tmp_path_factory.mktemp("lm_files")
    p = model.config.projection_dim
    rng = np.random.default_rng(0)
    with h5py.File(d / "softmax.hdf5", "w") as f:
        f["softmax/W"] = rng.normal(0, 0.5, size=(len(WORDS), p)).astype(np.float32)
        f["softmax/b"] = rng.normal(0, 0.5, size=len(WORDS)).astype(np.float32)
    (d / "vocab.txt").write_text("\n".join(WORDS) + "\n")
    return d


@pytest.fixture(scope="module")
def exported(lm_files, tmp_path_factory):
    model = load_test_model()
    randomize_weights(model, 2, scale=0.3)
    lm = load_language_model(
        None, None, str(lm_files / "softmax.hdf5"), str(lm_files / "vocab.txt"), elmo=model, top_k=TOP_K
    )
    base = tmp_path_factory.mktemp("export") / "elmo"
    return ex.export_elmo(model, str(base), lm=lm), lm, model


def in_process(lm, token_lists):
    tokens, _ = ex._pad([[t.encode() for t in row] for row in token_lists])
    out = lm.score_tokens(tf.constant(tokens, tf.string))
    return {key: np.asarray(out[key]) for key in KEYS}


def assert_same(expected, actual):
    assert sorted(actual) == sorted(KEYS)
    for key in KEYS:
        want, got = np.asarray(expected[key]), np.asarray(actual[key])
        assert got.shape == want.shape, (key, got.shape, want.shape)
        if want.dtype.kind == "f":
            np.testing.assert_allclose(got, want, atol=ATOL, rtol=0, err_msg=key)
        else:
            assert (got == want).all(), key


ROWS = [["The", "cat", "sat", "on", "the", "mat", "."], ["Dogs", "zebra"], []]


@pytest.mark.slow
def test_the_reloaded_lm_signature_equals_the_language_model(exported):
    path, lm, model = exported
    loaded = tf.saved_model.load(path)
    assert "lm" in loaded.signatures and "tokens" in loaded.signatures
    tokens, lengths = ex._pad([[t.encode() for t in row] for row in ROWS])
    junk = np.where(tokens == b"", b"junk", tokens)  # beyond sequence_len: ignored
    got = {k: v.numpy() for k, v in loaded.signatures["lm"](tokens=tf.constant(junk), sequence_len=lengths).items()}
    expected = in_process(lm, ROWS)
    assert_same(expected, got)
    assert got["forward_log_probs"].shape == (3, 8)  # [B, T + 1]
    assert (got["forward_log_probs"][1, 3:] == 0).all() and (got["forward_top_k_words"][2, 1:] == b"").all()
    # the ELMo signatures are unchanged beside it
    ex.check_export(model, path)


def test_the_embedded_servers_servable_answers_lm_alone_and_merged(exported):
    path, lm, _ = exported
    servable = load_servable("elmo", 1, path, Limits())
    runner = servable.runner("lm")
    assert runner.budget.position_cost == pytest.approx(1 + 2 * len(WORDS) * lm.config.projection_dim / 1e8)
    requests = []
    for rows in (ROWS[:1], ROWS[1:]):  # widths 7 and 2
        tokens, lengths = ex._pad([[t.encode() for t in row] for row in rows])
        requests.append(runner.budget.prepare({"tokens": tokens, "sequence_len": lengths}))
    alone = [runner.run_one(r) for r in requests]
    merged = run_batch(runner, requests)
    for rows, one, both in zip((ROWS[:1], ROWS[1:]), alone, merged):
        expected = in_process(lm, rows)
        assert_same(expected, one)
        assert_same(expected, both)  # cut back to the request's own T + 1


def test_the_request_budget_counts_the_softmax(exported):
    path, lm, _ = exported
    runner = load_servable("elmo", 1, path, Limits(max_request_tokens=100)).runner("lm")
    runner.budget.position_cost = 5.0  # as an 800k x 512 softmax would (9.1)
    tokens = np.array([[b"a"] * 10] * 3, object)
    with pytest.raises(ServingError, match=r"3 rows x 10 tokens wide x 5 \(the softmax's cost per position\) = 150"):
        runner.budget.prepare({"tokens": tokens, "sequence_len": np.full(3, 10, np.int32)})
    tokens = np.array([[b"a"] * 10] * 2, object)
    runner.budget.prepare({"tokens": tokens, "sequence_len": np.full(2, 10, np.int32)})  # 100: within


@pytest.mark.slow
def test_export_command_picks_the_softmax_from_a_run_dir_and_cuts_at_max_tokens(model, lm_files, tmp_path):
    """`--model-dir` with softmax.hdf5 and vocab.txt adds lm; --softmax without --vocab is a usage error; a softmax
    of the wrong width is one line naming it (exit 1).

    The same export (`--max-tokens 3`) checks that with max_tokens the lm signature scores each sentence's first 3
    tokens (a cut sentence ends at the cut: its last entry predicts </S> after word 3) and stays [B, T + 1] wide,
    zeros past the cut (before: test_max_tokens_cuts_the_sentences_not_the_width, an export of its own)."""
    run_dir = tmp_path / "run"
    from elmo_tf.models import save_elmo

    save_elmo(model, str(run_dir))
    for name in ("softmax.hdf5", "vocab.txt"):
        (run_dir / name).write_bytes((lm_files / name).read_bytes())
    argv = ["--model-dir", str(run_dir), "--output", str(tmp_path / "m"), "--lm-top-k", "2", "--max-tokens", "3"]
    assert run(export_main, argv) == 0  # the export's own check compares the cut
    loaded = tf.saved_model.load(str(tmp_path / "m" / "1"))
    out = loaded.signatures["lm"](tokens=tf.constant([[b"The", b"cat"]]), sequence_len=tf.constant([2]))
    assert out["forward_top_k_words"].shape == (1, 3, 2)
    # max_tokens 3: the first 3 tokens of a 7-token sentence scored as a sentence of 3, the width kept
    lm = load_language_model(None, None, str(lm_files / "softmax.hdf5"), str(lm_files / "vocab.txt"), elmo=model)
    tokens, lengths = ex._pad([[t.encode() for t in ROWS[0]]])
    got = loaded.signatures["lm"](tokens=tf.constant(tokens), sequence_len=lengths)
    expected = lm.score_tokens(tf.constant([[b"The", b"cat", b"sat"]]))["forward_log_probs"].numpy()
    assert got["forward_log_probs"].shape == (1, 8)
    np.testing.assert_allclose(got["forward_log_probs"].numpy()[:, :4], expected, atol=ATOL)
    assert (got["forward_log_probs"].numpy()[:, 4:] == 0).all()
    args = ["--model-dir", str(run_dir), "--output", str(tmp_path / "m2")]
    assert run(export_main, args + ["--softmax", str(run_dir / "softmax.hdf5")]) == 2
    with h5py.File(run_dir / "softmax.hdf5", "r+") as f:
        w = f["softmax/W"][...]
        del f["softmax/W"]
        f["softmax/W"] = w[:, :-1]
    assert run(export_main, args) == 1
    assert not (tmp_path / "m2").exists()


def test_the_embedded_server_answers_lm_over_rest(exported):
    """serving/serve.py's server, REST `:predict` with signature_name "lm" (columnar inputs), on 127.0.0.1."""
    import http.client
    import json
    import os

    from elmo_tf.serving.options import ServerOptions
    from elmo_tf.serving.server import ModelServer

    path, lm, _ = exported
    server = ModelServer({"elmo": os.path.dirname(path)}, ServerOptions(port=0, rest_api_port=0)).start()
    try:
        tokens, lengths = ex._pad([[t.encode() for t in row] for row in ROWS])
        body = {
            "signature_name": "lm",
            "inputs": {"tokens": tokens.astype(str).tolist(), "sequence_len": lengths.tolist()},
        }
        connection = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=60)
        connection.request("POST", "/v1/models/elmo:predict", body=json.dumps(body))
        response = connection.getresponse()
        status, answer = response.status, json.loads(response.read())
        connection.close()
    finally:
        server.stop(grace=1.0)
    assert status == 200, answer
    outputs = {k: np.asarray(v, dtype=np.float32 if "words" not in k else object) for k, v in answer["outputs"].items()}
    expected = in_process(lm, ROWS)
    for key in ("forward_log_probs", "backward_log_probs", "forward_top_k_log_probs", "backward_top_k_log_probs"):
        np.testing.assert_allclose(outputs[key], expected[key], atol=ATOL, rtol=0, err_msg=key)
    words = np.vectorize(lambda w: w.encode())(outputs["forward_top_k_words"])
    assert (words == expected["forward_top_k_words"]).all()
