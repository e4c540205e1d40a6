"""elmo_tf.ner.features.ServedFeatures against a real embedded server on 127.0.0.1 started with small request limits
(8 sentences, 100 tokens per sentence, 600 tokens per request): requests are packed under the limits the server
names, the features equal the in-process ones, a sentence over a limit is named (library, train_ner.py and tag.py:
one line with the file and line, exit 1). Issue 25 case 3: the source sent 32 sentences per request whatever their
length, and a RESOURCE_EXHAUSTED traceback ended train_ner.py on data the server takes in smaller requests."""

import os
import sys
from pathlib import Path

import forked
import grpc
import numpy as np
import pytest
from tiny_models import TINY

from elmo_tf.ner.features import (
    InProcessFeatures,
    SentenceTooLongError,
    ServedFeatures,
    pack_requests,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
LIMITS = dict(max_request_sentences=8, max_tokens_per_sentence=100, max_request_tokens=600)
WORDS = ["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", ".", "Peter", "Blackburn", "Zürich"]


def sentence(rng, n):
    return [str(w) for w in rng.choice(WORDS, size=n)]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(address, ElmoClient, the Keras ELMo): a tiny biLM exported and served with `LIMITS`."""
    import keras

    from elmo_tf import BiLMConfig, ELMo
    from elmo_tf.saved_model.export import export_elmo
    from elmo_tf.serving.client import ElmoClient
    from elmo_tf.serving.server import ModelServer, ServerOptions

    keras.utils.set_random_seed(5)
    model = ELMo(BiLMConfig(**TINY))
    base = tmp_path_factory.mktemp("served") / "elmo"
    export_elmo(model, str(base))
    options = ServerOptions(host="127.0.0.1", port=0, rest_api_port=None, enable_batching=False, **LIMITS)
    server = ModelServer({"elmo": str(base)}, options).start()
    address = f"127.0.0.1:{server.grpc_port}"
    client = ElmoClient(address, model_name="elmo", timeout=60.0)
    try:
        client.wait_for_model(timeout=60)
        yield address, client, model
    finally:
        client.close()
        server.stop(grace=1.0)


def test_pack_requests_keeps_both_limits():
    rng = np.random.default_rng(0)
    lengths = [int(n) for n in rng.integers(0, 90, size=200)]
    requests = pack_requests(lengths, max_sentences=8, max_tokens=600)
    assert sorted(i for r in requests for i in r) == list(range(200))
    for request in requests:
        width = max(1, max(lengths[i] for i in request))
        assert len(request) <= 8 and len(request) * width <= 600
        assert lengths[request[0]] == max(lengths[i] for i in request)  # longest first: the padded width
    assert pack_requests([700, 3], 8, 600) == [[0], [1]]  # longer than the budget: alone
    assert pack_requests([], 8, 600) == []


@pytest.mark.slow
def test_served_features_fit_the_servers_limits(served):
    """28 sentences of 90 tokens (28 rows and 2,520 tokens in one request of 32, above 8 rows and 600 tokens) and
    short ones: the source learns both limits from the server's answers and gets every sentence, equal to the
    in-process features."""
    _, client, model = served
    rng = np.random.default_rng(1)
    sentences = [sentence(rng, 90) for _ in range(28)] + [sentence(rng, int(n)) for n in rng.integers(0, 12, 20)]
    source = ServedFeatures(client)
    features = source(sentences)
    assert source.limits.max_sentences == 8 and source.limits.max_tokens == 600
    expected = InProcessFeatures(model)(sentences)
    for got, want, tokens in zip(features, expected, sentences):
        assert got.shape == want.shape == (3, len(tokens), 16)
        np.testing.assert_allclose(got, want, atol=1e-5)
    before = source.requests  # a second call packs under the learned limits at once: 6 rows of 90 per request
    source(sentences[:28])
    assert source.requests - before == 5  # 6 + 6 + 6 + 6 + 4


def test_a_sentence_over_the_servers_limit_is_named(served):
    _, client, _ = served
    rng = np.random.default_rng(2)
    sentences = [sentence(rng, 5), sentence(rng, 150), sentence(rng, 7)]
    source = ServedFeatures(client)
    with pytest.raises(SentenceTooLongError) as caught:
        source(sentences)
    assert caught.value.index == 1
    message = str(caught.value)
    assert "150 tokens" in message and "--max_tokens_per_sentence" in message and "100" in message, message
    before = source.requests
    with pytest.raises(SentenceTooLongError):  # now a known limit: refused before anything is sent
        source(sentences)
    assert source.requests == before


def test_a_given_token_limit_is_kept_and_refuses_before_sending(served):
    _, client, model = served
    rng = np.random.default_rng(3)
    sentences = [sentence(rng, 20) for _ in range(6)]
    source = ServedFeatures(client, batch_size=32, max_request_tokens=50)
    features = source(sentences)
    assert source.requests == 3  # 2 x 20 per request
    for got, want in zip(features, InProcessFeatures(model)(sentences)):
        np.testing.assert_allclose(got, want, atol=1e-5)
    with pytest.raises(SentenceTooLongError, match="60 tokens") as caught:
        source([sentence(rng, 3), sentence(rng, 60)])
    assert caught.value.index == 1 and source.requests == 3


class SizeLimitedClient:
    """Wraps a client: RESOURCE_EXHAUSTED without a stated limit (as gRPC's own message size error) above
    `max_cells` rows x width, RESOURCE_EXHAUSTED 'busy' for the first `busy` calls."""

    def __init__(self, client, max_cells, busy=0):
        self.client, self.max_cells, self.busy, self.refused = client, max_cells, busy, 0

    def embed_tokens(self, tokens, sequence_len=None, output_filter=None):
        from elmo_tf.serving.serving_error import ServingError

        tokens = np.asarray(tokens, dtype=object) if not isinstance(tokens, np.ndarray) else tokens
        if tokens.shape[0] > 1 and self.busy:
            self.busy -= 1
            raise ServingError(grpc.StatusCode.RESOURCE_EXHAUSTED, "requests in flight (--max_requests_in_flight 1)")
        if tokens.size > self.max_cells:
            self.refused += 1
            raise ServingError(grpc.StatusCode.RESOURCE_EXHAUSTED, "Received message larger than max (5 vs. 4)")
        return self.client.embed_tokens(tokens, sequence_len=sequence_len, output_filter=output_filter)


def test_an_unstated_limit_halves_the_requests_and_busy_is_retried(served):
    _, client, model = served
    rng = np.random.default_rng(4)
    sentences = [sentence(rng, 10) for _ in range(16)]
    limited = SizeLimitedClient(client, max_cells=30, busy=2)
    source = ServedFeatures(limited, batch_size=8)
    features = source(sentences)
    assert limited.refused >= 1 and limited.busy == 0 and source.limits.max_tokens <= 30
    for got, want in zip(features, InProcessFeatures(model)(sentences)):
        np.testing.assert_allclose(got, want, atol=1e-5)
    with pytest.raises(SentenceTooLongError, match="refused by the server") as caught:
        source([sentence(rng, 2), sentence(rng, 40)])
    assert caught.value.index == 1
    from elmo_tf.serving.serving_error import ServingError

    busy = ServedFeatures(SizeLimitedClient(client, max_cells=10**6, busy=100), batch_size=8)
    with pytest.raises(ServingError, match="in flight"):  # busy to the end: the server's error, no sentence blamed
        busy([sentence(rng, 3) for _ in range(4)])


# ------------------------------------------------------------------------------------------------ command lines


def run_cli(script, *args, input=None):
    return forked.run(
        [sys.executable, str(REPO_ROOT / "training" / script), *map(str, args)],
        cwd=REPO_ROOT,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO_ROOT)),
        input=input,
        capture_output=True,
        text=True,
        timeout=300,
    )


def write_conll(path, sentences):
    """CoNLL-2003-like (4 columns); returns the 1-based line of each sentence's first token."""
    lines, starts = ["-DOCSTART- -X- O O", ""], []
    for tokens in sentences:
        starts.append(len(lines) + 1)
        lines += [f"{t} NNP I-NP {'I-PER' if t == 'Peter' else 'O'}" for t in tokens] + [""]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return starts


def own_error_lines(stderr):
    return [line for line in stderr.splitlines() if "error:" in line]


@pytest.fixture(scope="module")
def served_tagger(served, tmp_path_factory):
    """train_ner.py --elmo-server on 28 sentences of 30 tokens (840 tokens > the server's 600 per request)."""
    address, _, _ = served
    root = tmp_path_factory.mktemp("ner")
    rng = np.random.default_rng(6)
    write_conll(root / "train.txt", [sentence(rng, 30) for _ in range(28)] + [["Peter", "left"]])
    write_conll(root / "dev.txt", [sentence(rng, 8) for _ in range(4)] + [["Peter"]])
    result = run_cli(
        "train_ner.py",
        "--train",
        root / "train.txt",
        "--dev",
        root / "dev.txt",
        "--elmo-server",
        address,
        "--epochs",
        1,
        "--lstm-units",
        4,
        "--output",
        root / "out",
    )
    return root, result


@pytest.mark.slow
def test_train_ner_with_a_server_fits_its_limits(served_tagger):
    root, result = served_tagger
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and (root / "out" / "config.json").is_file()


def test_train_ner_names_the_line_of_a_sentence_over_the_servers_limit(served, tmp_path):
    address, _, _ = served
    rng = np.random.default_rng(7)
    starts = write_conll(tmp_path / "train.txt", [sentence(rng, 6), sentence(rng, 150), ["Peter"]])
    write_conll(tmp_path / "dev.txt", [["Peter"]])
    result = run_cli(
        "train_ner.py",
        "--train",
        tmp_path / "train.txt",
        "--dev",
        tmp_path / "dev.txt",
        "--elmo-server",
        address,
        "--output",
        tmp_path / "out",
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = own_error_lines(result.stderr)
    assert len(errors) == 1, result.stderr[-3000:]
    assert f"--train: {tmp_path / 'train.txt'}:{starts[1]}:" in errors[0], errors[0]
    assert "150 tokens" in errors[0] and "--max_tokens_per_sentence" in errors[0], errors[0]
    assert not (tmp_path / "out" / "model.keras").exists()


def test_tag_py_with_a_server_packs_and_names_a_long_line(served, served_tagger, tmp_path):
    address, _, _ = served
    root, trained = served_tagger
    assert trained.returncode == 0, trained.stderr[-3000:]
    rng = np.random.default_rng(8)
    lines = [" ".join(sentence(rng, 40)) for _ in range(20)]  # 20 x 40 > 600 per request
    result = run_cli("tag.py", "--model", root / "out", "--elmo-server", address, "--quiet", input="\n".join(lines))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("\n\n") == 20
    (tmp_path / "in.txt").write_text("a b\n\n" + " ".join(sentence(rng, 120)) + "\nc\n", encoding="utf-8")
    result = run_cli("tag.py", "--model", root / "out", "--input", tmp_path / "in.txt", "--quiet")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = own_error_lines(result.stderr)
    assert len(errors) == 1 and f"--input: {tmp_path / 'in.txt'}:3:" in errors[0], result.stderr[-3000:]
    assert "120 tokens" in errors[0] and result.stdout == ""
