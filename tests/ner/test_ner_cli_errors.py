"""The NER command lines on bad input: one line on stderr naming the flag, the file and (for data) the line; exit 2
for usage, 1 for data; no traceback; nothing written. And on careless input that is valid: many blank lines."""

import json
from pathlib import Path

import numpy as np
import pytest
from cli_testlib import assert_ends_with_one_error, run_limited

REPO = Path(__file__).resolve().parents[2]
TRAIN_NER = REPO / "training" / "train_ner.py"
TUNE_NER = REPO / "training" / "tune_ner.py"
TAG = REPO / "training" / "tag.py"

GOOD = "EU B-ORG\nrejects O\n\nPeter B-PER\nBlackburn I-PER\n"


def write(path, data):
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


def assert_one_line(code, err, want_code, *needles):
    assert code == want_code, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, (needle, err)


@pytest.mark.parametrize(
    "content, needles",
    [
        (b"EU B-ORG\nrejects O\n\nPeter B-PER\nBlack\xffburn I-PER\n", ["--dev", "dev.txt:5", "UTF-8"]),
        ("\ufeffEU B-ORG\n".encode("utf-16"), ["--dev", "dev.txt"]),
        ("EU B-ORG\nrejects\n", ["--dev", "dev.txt:2"]),
        ("EU B-ORG\nrejects Q-XX\n", ["--dev", "dev.txt:2", "Q-XX"]),
        ("EU B-ORG\nPeter B-NEW\n", ["--dev", "dev.txt:1", "B-NEW"]),  # a label never seen in train
        ("", ["--dev", "no sentences"]),
    ],
    ids=["invalid-utf8", "utf16", "one-column", "bad-tag", "unseen-label", "empty"],
)
def test_train_ner_bad_data_names_file_and_line(tmp_path, run_script, content, needles):
    train, dev = write(tmp_path / "train.txt", GOOD), write(tmp_path / "dev.txt", content)
    argv = ["--train", train, "--dev", dev, "--no-elmo", "--output", tmp_path / "out"]
    code, _, err = run_script(TRAIN_NER, argv)
    assert_one_line(code, err, 1, *needles)
    assert not (tmp_path / "out" / "model.keras").exists()


@pytest.mark.parametrize(
    "extra, needles",
    [
        (["--output", "FILE"], ["--output: exists and is not a directory"]),
        (["--output", "OUT", "--epochs", "0"], ["--epochs"]),
        (["--output", "OUT", "--dropout", "1.5"], ["--dropout"]),
        (["--output", "OUT", "--learning-rate", "nan"], ["--learning-rate"]),
        (["--output", "OUT", "--elmo", "NOWHERE"], ["--elmo: no options.json"]),
        (["--output", "OUT", "--no-elmo", "--no-word-features", "--no-char-features"], ["no features"]),
        (["--output", "OUT", "--cache", "OUT_DIR"], ["--cache: is a directory"]),
    ],
    ids=["output-is-a-file", "epochs-0", "dropout", "nan-rate", "no-elmo-files", "no-features", "cache-dir"],
)
def test_train_ner_usage_errors(tmp_path, run_script, extra, needles):
    train = write(tmp_path / "train.txt", GOOD)
    write(tmp_path / "file", "x")
    (tmp_path / "dir").mkdir()
    names = {
        "FILE": tmp_path / "file",
        "OUT": tmp_path / "out",
        "NOWHERE": tmp_path / "nowhere",
        "OUT_DIR": tmp_path / "dir",
    }
    argv = ["--train", train, "--dev", train] + [names.get(a, a) for a in extra]
    if not any(a in extra for a in ("--elmo",)) and "--no-elmo" not in extra:
        argv.append("--no-elmo")
    code, _, err = run_script(TRAIN_NER, argv)
    assert_one_line(code, err, 2, *needles)


def test_tune_ner_refuses_seed_zero_and_bad_data(tmp_path, run_script):
    train = write(tmp_path / "train.txt", GOOD)
    bad = write(tmp_path / "bad.txt", b"EU B-ORG\n\xc3\x28 O\n")
    common = ["--no-elmo", "--directory", tmp_path / "t", "--output", tmp_path / "o"]
    code, _, err = run_script(TUNE_NER, ["--train", train, "--dev", train, "--seed", "0", *common])
    assert_one_line(code, err, 2, "--seed")
    code, _, err = run_script(TUNE_NER, ["--train", bad, "--dev", train, *common])
    assert_one_line(code, err, 1, "--train", "bad.txt:2", "UTF-8")


@pytest.fixture(scope="module")
def tagger_dir(tmp_path_factory):
    """A tiny --no-elmo tagger, trained for one epoch through the library (what train_ner.py calls)."""
    from elmo_tf.ner.training import NERConfig, load_data, train_tagger

    root = tmp_path_factory.mktemp("tagger")
    train = write(root / "train.txt", GOOD * 3)
    data = load_data({"train": str(train), "dev": str(train)})
    train_tagger(NERConfig(epochs=1, lstm_units=4, use_chars=False), data, str(root / "ner"))
    return root / "ner"


@pytest.mark.parametrize(
    "content, needles",
    [
        (b"EU rejects\nPeter \xff Blackburn\n", ["--input", "in.txt:2", "not UTF-8"]),
        ("Peter Blackburn\n".encode("utf-16"), ["--input", "in.txt:1", "not UTF-8"]),
    ],
    ids=["invalid-utf8", "utf16"],
)
def test_tag_bad_text_names_the_line(tagger_dir, tmp_path, run_script, content, needles):
    text = write(tmp_path / "in.txt", content)
    code, out, err = run_script(TAG, ["--model", tagger_dir, "--input", text, "--quiet"])
    assert_one_line(code, err, 1, *needles)
    assert out == ""


def test_tag_reads_bom_and_crlf(tagger_dir, tmp_path, run_script):
    text = write(tmp_path / "in.txt", "\ufeffEU rejects\r\nPeter Blackburn\r\n")
    code, out, err = run_script(TAG, ["--model", tagger_dir, "--input", text, "--quiet"])
    assert code == 0, err
    assert [line.split("\t")[0] for line in out.splitlines() if line] == ["EU", "rejects", "Peter", "Blackburn"]


def test_tag_damaged_model_is_a_data_error(tagger_dir, tmp_path, run_script):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tagger_dir, broken)
    (broken / "model.keras").write_bytes(b"not a zip")
    text = write(tmp_path / "in.txt", "EU rejects\n")
    code, _, err = run_script(TAG, ["--model", broken, "--input", text, "--quiet"])
    assert_one_line(code, err, 1, "--model", "model.keras")
    (broken / "encoder.json").write_bytes(b"\xff\xfe")
    shutil.copy(tagger_dir / "model.keras", broken / "model.keras")
    code, _, err = run_script(TAG, ["--model", broken, "--input", text, "--quiet"])
    assert_one_line(code, err, 1, "--model", "encoder.json")


def test_tag_py_many_blank_lines(tmp_path, run_script):
    """10 sentences among 40 blank lines (sorted by length, the first batch holds empty sentences only; it failed with
    "slice index 0 of dimension 1 out of bounds"): one result per line, in order, in both formats; a blank line gets
    no tags, the others the tags they get when tagged alone (a head with random weights: varied tags)."""
    import keras

    from elmo_tf.ner import Encoder
    from elmo_tf.ner.model import NERTagger
    from elmo_tf.ner.tagging import format_conll, load_tagger, tag_sentences
    from elmo_tf.ner.tags import labels_for

    sentences = [
        "Peter Blackburn visited Paris",
        "EU rejects German call to boycott British lamb .",
        "Anna",
        "the European Commission said on Thursday",
        "Li Wei joined Siemens in Berlin",
        "x",
        "BRUSSELS 1996-08-22",
        "Mary and Ahmed Khan met in Lima .",
        "New York",
        "Reuters",
    ]
    lines = [""] * 50
    for position, sentence in zip((0, 4, 5, 17, 30, 31, 32, 40, 46, 49), sentences):
        lines[position] = sentence
    text = write(tmp_path / "in.txt", "\n".join(lines) + "\n")
    keras.utils.set_random_seed(2)
    labels = labels_for({"PER", "LOC", "ORG"}, "bioes")
    model = NERTagger(labels, "bioes", num_elmo_layers=0, word_vocab_size=12, word_dim=8, lstm_units=8)
    model.build_for(None)
    rng = np.random.default_rng(2)
    for var in model.weights:
        var.assign(rng.normal(0, 1.0, size=tuple(var.shape)).astype("float32") * (0.1 if "crf" in var.path else 1.0))
    model_dir = tmp_path / "ner"
    model_dir.mkdir()
    model.save(model_dir / "model.keras")
    words = sorted({w.lower() for s in sentences for w in s.split()})[:10]
    Encoder(labels, "bioes", words, "iob2").save(model_dir / "encoder.json")

    code, out, err = run_script(TAG, ["--model", model_dir, "--input", text, "--format", "json", "--quiet"])
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [row["tokens"] for row in rows] == [line.split() for line in lines]
    loaded, encoder, _ = load_tagger(str(model_dir))
    alone = tag_sentences(loaded, encoder, [s.split() for s in sentences])
    assert [row["tags"] for row in rows if row["tokens"]] == alone
    assert [row for row in rows if not row["tokens"]] == [{"tokens": [], "tags": [], "spans": []}] * 40
    assert len({tag for tags in alone for tag in tags}) >= 3
    code, out, err = run_script(TAG, ["--model", model_dir, "--input", text, "--quiet"])
    assert code == 0, err
    assert out == "".join(format_conll(row["tokens"], row["tags"]) for row in rows)  # a blank line: "\n"


def test_tag_output_on_a_full_disk_is_one_line_naming_the_file(tagger_dir, tmp_path):
    """`tag.py > file` where the disk refuses the output (a file-size limit: EFBIG, as a full disk gives ENOSPC):
    exit 1, one line naming the file and the error, no traceback, no "Exception ignored" at exit."""
    text = write(tmp_path / "in.txt", "EU rejects German call to boycott British lamb .\n" * 400)  # ~60 kB of CoNLL
    with open(tmp_path / "tagged.txt", "w") as stdout:
        result = run_limited([TAG, "--model", tagger_dir, "--input", text, "--quiet"], 8192, stdout=stdout)
    assert_ends_with_one_error(result, 1, "stdout", f"cannot write {str(tmp_path / 'tagged.txt')!r}", "File too large")
    assert (tmp_path / "tagged.txt").stat().st_size <= 8192
