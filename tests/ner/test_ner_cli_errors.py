"""The NER command lines on bad input: one line on stderr naming the flag, the file and (for data) the line; exit 2
for usage, 1 for data; no traceback; nothing written."""

import math
import types
from pathlib import Path

import pytest

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


@pytest.mark.parametrize(
    "field, value",
    [("seed", -1), ("seed", 2**32), ("seed", 1.0), ("learning_rate", math.inf), ("learning_rate", math.nan),
     ("gamma", math.inf), ("mix_l2", math.inf)],
)  # fmt: skip
def test_ner_config_names_a_seed_numpy_refuses_and_infinite_rates(field, value):
    from elmo_tf.ner.training import NERConfig

    with pytest.raises(ValueError, match=f"^{field} must be .*got {value!r}"):
        NERConfig(**{field: value})
    assert NERConfig(seed=0).seed == 0 and NERConfig(seed=2**32 - 1).seed == 2**32 - 1


def test_search_blames_the_directory_only_when_it_reloads_a_project(tmp_path):
    """tune_ner.py --seed 4294967296 said "--directory: cannot use the project ...": `search` made every error of
    the tuner's constructor a ResumeError, though a new directory has nothing to do with it."""
    from elmo_tf.ner import tuning
    from elmo_tf.ner.training import NERConfig

    config = NERConfig()
    config.seed = 2**32  # past NERConfig's own check, as a caller could
    with pytest.raises(ValueError) as info:
        tuning.search(config, types.SimpleNamespace(num_layers=0), str(tmp_path / "tune"))
    assert not isinstance(info.value, tuning.ResumeError) and "seed" in str(info.value).lower(), info.value


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
