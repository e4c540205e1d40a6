"""`elmo-tf score` (elmo_tf/cli/score.py, elmo_tf/embed/score.py): JSON lines of per-token log-probabilities and top-k
words, whose perplexities are evaluate-lm's; bad files and flags give one line naming them."""

import json
import logging
import math

import h5py
import numpy as np
import pytest
from cli_testlib import REPO_ROOT, assert_one_error, run_command
from tiny_models import TINY, randomize_weights

from elmo_tf.cli import run
from elmo_tf.cli.evaluate_lm import main as evaluate_main
from elmo_tf.cli.score import main as score_main
from elmo_tf.config import BiLMConfig
from elmo_tf.io.vocabulary import Vocabulary
from elmo_tf.models import BiLMPretrainer
from elmo_tf.pretraining import write_model_dir

WORDS = ["<S>", "</S>", "<UNK>"] + "the cat sat on a mat dog ran . ,".split()
TEXT = "the cat sat on the mat .\na dog ran , the zebra sat\n\nmat\n"
PROG = "elmo-tf score: error:"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny biLM with random weights, as training/pretrain.py writes it."""
    d = tmp_path_factory.mktemp("score") / "run"
    model = BiLMPretrainer(BiLMConfig(**TINY), len(WORDS), dropout=0.0)
    randomize_weights(model, 7, scale=0.5)
    write_model_dir(model, Vocabulary(WORDS), d)
    return d


@pytest.fixture
def text(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text(TEXT)
    return path


def score(capsys, *argv):
    """Runs `elmo-tf score ARGV` in this process: (exit status, stderr)."""
    try:
        code = run(lambda args: score_main(args), [str(a) for a in argv], prog="elmo-tf score")
    except SystemExit as e:  # argparse's own errors
        code = e.code
    return code, capsys.readouterr().err


def test_score_writes_a_line_per_input_line_and_its_perplexity_is_evaluate_lms(model_dir, text, tmp_path, capsys):
    out = tmp_path / "scores.jsonl"
    code, err = score(
        capsys, "--model", model_dir, "--input", text, "--output", out, "--top-k", "3", "--batch-size", "2"
    )
    assert code == 0, err
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["tokens"] for r in records] == [line.split() for line in TEXT.splitlines()]
    for record in records:
        n = len(record["tokens"])
        for direction in ("forward", "backward"):
            assert len(record[f"{direction}_log_probs"]) == n + 1
            top = record[f"{direction}_top_k"]
            assert len(top) == n + 1 and all(len(entry) == 3 for entry in top)
            assert all(isinstance(w, str) and p <= 0 for entry in top for w, p in entry)
        # the true word's score is its entry in the top k, where it is listed
        targets = [w if w in WORDS else "<UNK>" for w in record["tokens"]] + ["</S>"]
        for j, word in enumerate(targets):
            listed = dict(record["forward_top_k"][j])
            if word in listed:
                assert listed[word] == pytest.approx(record["forward_log_probs"][j], abs=1e-6)
    # perplexity over the file: evaluate-lm skips blank lines; the others are scored whole (all < 50 tokens)
    scored = [r for r in records if r["tokens"]]
    count = sum(len(r["forward_log_probs"]) for r in scored)
    ppl = {d: math.exp(-sum(sum(r[f"{d}_log_probs"]) for r in scored) / count) for d in ("forward", "backward")}
    assert run(evaluate_main, ["--model", str(model_dir), "--test", str(text)], prog="evaluate_lm.py") == 0
    reported = json.loads(capsys.readouterr().out)
    assert reported["tokens"] == count
    for direction in ("forward", "backward"):
        assert ppl[direction] == pytest.approx(reported[direction], rel=1e-5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "scores.jsonl"]  # no temporary left


def test_the_four_files_give_what_the_run_dir_gives(model_dir, text, tmp_path, capsys):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert score(capsys, "--model", model_dir, "--input", text, "--output", a)[0] == 0
    files = [
        "--options",
        "options.json",
        "--weights",
        "weights.hdf5",
        "--softmax",
        "softmax.hdf5",
        "--vocab",
        "vocab.txt",
    ]
    files = [model_dir / f if f.endswith((".json", ".hdf5", ".txt")) else f for f in files]
    assert score(capsys, *files, "--input", text, "--output", b, "--batch-size", "1")[0] == 0
    for x, y in zip(a.read_text().splitlines(), b.read_text().splitlines()):
        x, y = json.loads(x), json.loads(y)
        assert x["tokens"] == y["tokens"] and "forward_top_k" not in x
        np.testing.assert_allclose(x["forward_log_probs"], y["forward_log_probs"], atol=1e-6)
        np.testing.assert_allclose(x["backward_log_probs"], y["backward_log_probs"], atol=1e-6)


def test_precision_reaches_the_model_and_a_bfloat16_record_says_so(model_dir, text, tmp_path, capsys, caplog):
    """--precision bfloat16 scores with the biLM and the softmax computing in bfloat16: each record says
    "precision": "bfloat16", its log-probabilities differ from float32's by bfloat16's rounding (above 1e-5, within
    0.05 nats here); float32 records are as they always were (no "precision" key)."""
    out = {p: tmp_path / f"{p}.jsonl" for p in ("float32", "bfloat16")}
    for precision, path in out.items():
        with caplog.at_level(logging.INFO):
            code, err = score(capsys, "--model", model_dir, "--input", text, "--output", path, "--precision", precision)
        assert code == 0, err
        assert f"computed in {precision}; wrote {path}" in caplog.text
    records = {p: [json.loads(line) for line in path.read_text().splitlines()] for p, path in out.items()}
    assert all("precision" not in r for r in records["float32"])
    assert all(r["precision"] == "bfloat16" for r in records["bfloat16"])
    diffs = [
        abs(a - b)
        for x, y in zip(records["float32"], records["bfloat16"])
        for d in ("forward", "backward")
        for a, b in zip(x[f"{d}_log_probs"], y[f"{d}_log_probs"])
    ]
    assert 1e-5 < max(diffs) < 0.05, max(diffs)


@pytest.fixture
def damaged(model_dir, tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    for p in model_dir.iterdir():
        (d / p.name).write_bytes(p.read_bytes())
    return d


@pytest.mark.parametrize(
    "damage,flag,needle",
    [
        ("rows", "--softmax", "softmax/W has 12 rows, the vocabulary of"),
        ("width", "--softmax", "softmax/W is 7 wide, the biLM's projection_dim is 8"),
        ("no_unk", "--vocab", "has no <UNK>"),
        ("blank", "--vocab", ":4: blank line"),
    ],
)
def test_files_that_do_not_fit_give_one_line_naming_the_file(damaged, text, tmp_path, capsys, damage, flag, needle):
    softmax, vocab = damaged / "softmax.hdf5", damaged / "vocab.txt"
    if damage in ("rows", "width"):
        with h5py.File(softmax, "r+") as f:
            w = f["softmax/W"][...]
            del f["softmax/W"]
            f["softmax/W"] = w[:-1] if damage == "rows" else w[:, :-1]
            if damage == "rows":
                b = f["softmax/b"][...]
                del f["softmax/b"]
                f["softmax/b"] = b[:-1]
    elif damage == "no_unk":
        vocab.write_text("\n".join(w for w in WORDS if w != "<UNK>") + "\n")
    else:
        vocab.write_text("\n".join(WORDS[:3] + [""] + WORDS[3:]) + "\n")
    code, err = score(capsys, "--model", damaged, "--input", text, "--output", tmp_path / "o.jsonl")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1, err
    path = softmax if flag == "--softmax" else vocab
    assert lines[0].startswith(f"{PROG} {flag}: {path}") and needle in lines[0], lines[0]
    assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--top-k", "-1"], "--top-k must be >= 0, got '-1'"),
        (["--top-k", "1001"], "--top-k must be <= 1000, got '1001'"),
        (["--batch-size", "0"], "--batch-size must be >= 1, got '0'"),
        (["--max-batch-tokens", str(2**31)], "--max-batch-tokens must be <= 2147483647 (int32)"),
        (["--top-k", "20"], "--top-k: top_k must be <= vocab_size 13, got 20"),
        (["--options", "x.json"], "--model: not allowed with --options"),
        (["--precision", "fp16"], "argument --precision: invalid choice: 'fp16'"),
    ],
)
def test_usage_errors(model_dir, text, tmp_path, capsys, extra, needle):
    if extra[0] == "--options":
        extra = ["--options", str(text)]
    code, err = score(capsys, "--model", model_dir, "--input", text, "--output", tmp_path / "o.jsonl", *extra)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err


def test_missing_model_files_and_an_output_over_the_input_as_a_command(model_dir, text, tmp_path):
    """As a real command: the usage errors answer in one line, exit 2, before anything is loaded."""
    main = REPO_ROOT / "elmo_tf" / "__main__.py"
    result = run_command([main, "score", "--options", text, "--input", text, "--output", tmp_path / "o.jsonl"])
    assert_one_error(result, 2, "score: error: --weights: required (or pass --model RUN_DIR)")
    result = run_command([main, "score", "--model", model_dir, "--input", text, "--output", text])
    assert_one_error(result, 2, "score: error: --output", "same file as --input")
    assert text.read_text() == TEXT


def test_a_softmax_that_overflows_is_one_line_not_invalid_json(damaged, text, tmp_path, capsys):
    """Finite but huge softmax weights (3e38, each under float32's largest) overflow the logits: inf - inf = NaN.
    `json.dumps` would write the bare tokens NaN / -Infinity, which no strict JSON reader accepts."""
    with h5py.File(damaged / "softmax.hdf5", "r+") as f:
        f["softmax/W"][...] = np.where(np.arange(f["softmax/W"].shape[1]) % 2, 3e38, -3e38).astype(np.float32)
    out = tmp_path / "o.jsonl"
    code, err = score(capsys, "--model", damaged, "--input", text, "--output", out)
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("score:", "INFO"))]
    assert code == 1 and len(lines) == 1, err
    assert lines[0].startswith(f"{PROG} {text}:1: the model's") and "not finite" in lines[0], lines[0]
    assert not out.exists()


def test_a_line_longer_than_the_bound_is_scored_cut_and_its_record_says_so(model_dir, tmp_path, capsys):
    """--max-sentence-tokens (default DEFAULT_MAX_SENTENCE_TOKENS): a longer line is scored on its first N tokens
    (each in its own context: a piece scored apart would start as a sentence does), its record marked."""
    from elmo_tf.io.sentences import DEFAULT_MAX_SENTENCE_TOKENS

    path = tmp_path / "in.txt"
    path.write_text("the cat sat on the mat\nthe cat\n")
    out, whole = tmp_path / "cut.jsonl", tmp_path / "whole.jsonl"
    code, err = score(capsys, "--model", model_dir, "--input", path, "--output", out, "--max-sentence-tokens", "3")
    assert code == 0, err
    cut, short = [json.loads(line) for line in out.read_text().splitlines()]
    assert cut["tokens"] == ["the", "cat", "sat"] and cut["truncated"] is True and cut["line_tokens"] == 6
    assert len(cut["forward_log_probs"]) == 4 and "truncated" not in short
    code, err = score(capsys, "--model", model_dir, "--input", path, "--output", whole)
    assert code == 0, err
    first = json.loads(whole.read_text().splitlines()[0])
    assert "truncated" not in first and len(first["tokens"]) == 6 < DEFAULT_MAX_SENTENCE_TOKENS
    assert first["forward_log_probs"][:3] == pytest.approx(cut["forward_log_probs"][:3], abs=1e-5)
