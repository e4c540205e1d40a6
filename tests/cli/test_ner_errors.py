"""The NER command lines on bad input: one line on stderr naming the flag, the file and (for data) the line; exit 2
for usage, 1 for data; no traceback; nothing written. And on careless input that is valid: many blank lines."""

import json
import logging
import math
import types
from pathlib import Path

import forked
import numpy as np
import pytest
from cli_testlib import assert_ends_with_one_error, limit_file_size, run_limited

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
        (["--output", "OUT", "--precision", "bfloat16"], ["--precision: only with --elmo", "--no-elmo has no biLM"]),
        (
            ["--output", "OUT", "--elmo-server", "localhost:1", "--precision", "auto"],
            ["--precision: only with --elmo", "--elmo-server computes in the precision of its export"],
        ),
    ],
    ids=[
        *("output-is-a-file", "epochs-0", "dropout", "nan-rate", "no-elmo-files", "no-features", "cache-dir"),
        *("precision-no-elmo", "precision-served"),
    ],
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
    if not any(a in extra for a in ("--elmo", "--elmo-server")) and "--no-elmo" not in extra:
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


# ------------------------------------------------------------------------------------------------ outputs vs inputs


@pytest.fixture(scope="module")
def tiny_elmo_dir(tmp_path_factory):
    """options.json + weights.hdf5 of a tiny random biLM."""
    import keras
    import numpy as np
    from tiny_models import TINY

    from elmo_tf import BiLMConfig, ELMo, save_elmo

    keras.utils.set_random_seed(3)
    model = ELMo(BiLMConfig(**TINY))
    model.embed_tokens(np.array([["a"]], dtype=object))
    directory = tmp_path_factory.mktemp("elmo") / "elmo"
    save_elmo(model, str(directory))
    return directory


@pytest.mark.parametrize(
    "target, needles",
    [
        ("TRAIN", ["--cache", "train.txt", "same file as --train"]),
        ("DEV_LINK", ["--cache", "dev-link.txt", "same file as --dev"]),
        ("WEIGHTS", ["--cache", "weights.hdf5", "same file as --elmo"]),
        ("NOTES", ["--cache", "notes.txt", "not a feature cache"]),
        ("FOREIGN_HDF5", ["--cache", "other.hdf5", "not a feature cache"]),
        ("OUTPUT_CONFIG", ["--cache", "config.json", "--output writes"]),
    ],
    ids=["train-file", "link-to-dev", "elmo-weights", "notes", "foreign-hdf5", "output-file"],
)
def test_train_ner_cache_never_destroys_a_file(tmp_path, run_script, tiny_elmo_dir, target, needles):
    """Issue 25 case 1: `--cache` on the run's own --train file, an unrelated file or the biLM's weights removed or
    rewrote it (exit 0). Now: one usage line naming --cache and the path, exit 2, every file as it was."""
    import h5py

    train, dev = write(tmp_path / "train.txt", GOOD), write(tmp_path / "dev.txt", GOOD)
    (tmp_path / "dev-link.txt").symlink_to(dev)
    notes = write(tmp_path / "notes.txt", "my notes\n")
    with h5py.File(tmp_path / "other.hdf5", "w") as f:
        f["x"] = [1.0, 2.0]
    paths = {
        "TRAIN": train,
        "DEV_LINK": tmp_path / "dev-link.txt",
        "WEIGHTS": tiny_elmo_dir / "weights.hdf5",
        "NOTES": notes,
        "FOREIGN_HDF5": tmp_path / "other.hdf5",
        "OUTPUT_CONFIG": tmp_path / "out" / "config.json",
    }
    files = [train, dev, notes, tmp_path / "other.hdf5", *tiny_elmo_dir.iterdir()]
    before = {path: path.read_bytes() for path in files}
    argv = ["--train", train, "--dev", dev, "--elmo", tiny_elmo_dir, "--output", tmp_path / "out"]
    code, _, err = run_script(TRAIN_NER, [*argv, "--epochs", "1", "--cache", paths[target]])
    assert_one_line(code, err, 2, *needles)
    assert {path: path.read_bytes() for path in files} == before
    assert not (tmp_path / "out").exists()


def test_train_ner_outputs_are_never_inputs(tmp_path, run_script, tiny_elmo_dir):
    """A file --output writes that is an input (a dev file named config.json there), or --output in the biLM's
    directory (a pretraining run's metrics.json there): refused before any work."""
    import shutil

    out = tmp_path / "out"
    out.mkdir()
    train, dev = write(tmp_path / "train.txt", GOOD), write(out / "config.json", GOOD)
    code, _, err = run_script(TRAIN_NER, ["--train", train, "--dev", dev, "--no-elmo", "--output", out])
    assert_one_line(code, err, 2, "--output", "config.json", "same file as --dev")
    assert dev.read_text() == GOOD
    elmo = tmp_path / "elmo"
    shutil.copytree(tiny_elmo_dir, elmo)
    write(elmo / "metrics.json", '{"perplexity": 40.0}\n')
    code, _, err = run_script(TRAIN_NER, ["--train", train, "--dev", train, "--elmo", elmo, "--output", elmo])
    assert_one_line(code, err, 2, "--output", "biLM's directory")
    assert (elmo / "metrics.json").read_text() == '{"perplexity": 40.0}\n'


@pytest.mark.slow
def test_train_ner_cache_is_reused_and_tag_refuses_a_recorded_biLM_changed_since_training(
    tmp_path, run_script, tiny_elmo_dir, caplog
):
    """Two facts of one train_ner.py run on a tiny biLM with --cache (formerly two tests, each training on its own):

    test_train_ner_cache_is_created_then_reused: the cache (its directory created) is written by the first run and
    read, not rewritten, by a second run, which gets the same scores (the same features, the same seed).

    test_tag_refuses_a_recorded_biLM_changed_since_training: config.json records where training's biLM was; tagging
    with that path after the weights were rewritten in place gave other features than training's, silently. Now the
    recorded content (sha256) is compared: exit 1 naming --elmo; an explicit --elmo is used as asked, with a warning."""
    import shutil

    import keras
    import numpy as np
    from tiny_models import TINY

    from elmo_tf import BiLMConfig, ELMo
    from elmo_tf.io.bilm_hdf5 import save_bilm_weights
    from elmo_tf.ner.feature_cache import CACHE_MAGIC

    elmo = tmp_path / "elmo"
    shutil.copytree(tiny_elmo_dir, elmo)
    train, dev = write(tmp_path / "train.txt", GOOD * 2), write(tmp_path / "dev.txt", GOOD)
    cache = tmp_path / "sub" / "features.hdf5"  # its directory is created
    argv = ["--train", train, "--dev", dev, "--elmo", elmo, "--epochs", "1", "--lstm-units", "4"]
    code, _, err = run_script(TRAIN_NER, [*argv, "--output", tmp_path / "ner", "--cache", cache])
    assert code == 0, err
    assert cache.read_bytes().startswith(CACHE_MAGIC)
    stat = cache.stat()
    code, _, err = run_script(TRAIN_NER, [*argv, "--output", tmp_path / "b", "--cache", cache])
    assert code == 0, err
    assert (cache.stat().st_mtime_ns, cache.stat().st_ino) == (stat.st_mtime_ns, stat.st_ino)  # read, not rewritten
    metrics = [json.loads((tmp_path / run / "metrics.json").read_text()) for run in ("ner", "b")]
    for run in metrics:
        run.pop("train_seconds")
    assert metrics[0] == metrics[1] and "dev" in metrics[0]  # the same features, the same seed: the same scores

    recorded = json.loads((tmp_path / "ner" / "config.json").read_text())["elmo_source"]
    assert recorded["kind"] == "in_process" and len(recorded["identity"]["sha256"]) == 64
    text = write(tmp_path / "in.txt", "EU rejects\n")
    code, out, err = run_script(TAG, ["--model", tmp_path / "ner", "--input", text, "--quiet"])
    assert code == 0 and out.startswith("EU\t"), err
    keras.utils.set_random_seed(11)
    other = ELMo(BiLMConfig(**TINY))
    other.embed_tokens(np.array([["a"]], dtype=object))
    save_bilm_weights(other, str(elmo / "weights.hdf5"))  # in place
    code, out, err = run_script(TAG, ["--model", tmp_path / "ner", "--input", text, "--quiet"])
    assert_one_line(code, err, 1, "--elmo", "changed since the tagger was trained", "config.json")
    assert out == ""
    with caplog.at_level(logging.WARNING, logger="tag"):
        code, out, err = run_script(TAG, ["--model", tmp_path / "ner", "--input", text, "--elmo", elmo])
    assert code == 0 and out.startswith("EU\t"), err
    assert "changed since the tagger was trained" in caplog.text and "as asked" in caplog.text


FAST_TUNE = ["--no-elmo", "--max-trials", "1", "--trial-epochs", "1", "--epochs", "1", "--lstm-units", "4"]


@pytest.mark.slow
def test_tune_ner_resume_notices_other_data_at_the_same_path(tmp_path, run_script):
    """The resumed project was keyed by the files' paths: a search resumed on other data at the same path mixed
    trials scored on two data sets. Now the content (sha256) is part of the settings."""
    train = write(tmp_path / "train.txt", GOOD * 3)
    argv = ["--train", train, "--dev", train, "--directory", tmp_path / "t", "--output", tmp_path / "o", *FAST_TUNE]
    code, _, err = run_script(TUNE_NER, argv)
    assert code == 0, err
    settings = json.loads((tmp_path / "t" / "ner" / "tune_ner_settings.json").read_text())
    assert len(settings["train_sha256"]) == 64 and settings["dev_sha256"] == settings["train_sha256"]
    # the same data at the same path resumes: test_tuning.py::test_rerun_resumes_the_same_project (a second search here
    # only retrained the tagger again)
    write(train, GOOD * 3 + "\nMary B-PER\n")
    code, _, err = run_script(TUNE_NER, argv)
    assert_one_line(code, err, 2, "--directory", "--train: the content changed", "--dev: the content changed")


def test_tune_ner_refuses_inputs_inside_the_project_directory(tmp_path, run_script):
    """KerasTuner writes the project directory and --overwrite deletes it: an input there was deleted."""
    project = tmp_path / "t" / "ner"
    project.mkdir(parents=True)
    train = write(project / "train.txt", GOOD)
    argv = ["--train", train, "--dev", train, "--directory", tmp_path / "t", "--output", tmp_path / "o", "--overwrite"]
    code, _, err = run_script(TUNE_NER, [*argv, *FAST_TUNE])
    assert_one_line(code, err, 2, "--directory", "--train", "train.txt")
    assert train.read_text() == GOOD and not (tmp_path / "o").exists()


def test_train_ner_on_a_full_disk_keeps_the_previous_cache(tmp_path, tiny_elmo_dir):
    """train_ner.py under a real file size limit (RLIMIT_FSIZE, as `ulimit -f`): one line naming --cache, the path
    and the error, exit 1, no traceback; the previous cache byte for byte, no temporary, no output."""
    import os
    import sys

    import numpy as np

    from elmo_tf.io.conll import Sentence
    from elmo_tf.ner.feature_cache import cached_features

    class Old:
        identity = {"kind": "test"}

        def __call__(self, token_lists, progress=None):
            return [np.zeros([3, len(t), 4], np.float32) for t in token_lists]

    cache = tmp_path / "features.hdf5"
    cached_features(Old(), [Sentence(["a"], ["O"], 1)], cache, key="test")
    before = cache.read_bytes()
    train = write(tmp_path / "train.txt", GOOD)
    limit = len(before) + (512 << 10)
    result = forked.run(
        [sys.executable, TRAIN_NER, "--train", train, "--dev", train, "--elmo", tiny_elmo_dir]
        + ["--output", tmp_path / "out", "--cache", cache],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES=""),
        preexec_fn=limit_file_size(limit),
        capture_output=True,
        text=True,
        timeout=300,
    )
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert len(errors) == 1 and "Exception ignored" not in result.stderr, result.stderr[-3000:]
    for needle in ("--cache", str(cache), "File too large", "previous cache is kept"):
        assert needle in errors[0], (needle, errors[0])
    assert cache.read_bytes() == before
    assert [n for n in os.listdir(tmp_path) if ".tmp-" in n] == [] and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_train_ner_output_on_a_full_disk_is_one_line(tmp_path):
    """model.keras under a real file size limit: was an OSError traceback; now one line naming --output and the
    file, exit 1, no temporary left."""
    import os
    import sys

    train = write(tmp_path / "train.txt", GOOD)
    result = forked.run(
        [sys.executable, TRAIN_NER, "--train", train, "--dev", train, "--no-elmo", "--epochs", "1"]
        + ["--lstm-units", "4", "--output", tmp_path / "out"],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES=""),
        preexec_fn=limit_file_size(20000),
        capture_output=True,
        text=True,
        timeout=300,
    )
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert len(errors) == 1 and "--output" in errors[0] and "model.keras" in errors[0], errors
    assert "File too large" in errors[0]
    assert sorted(os.listdir(tmp_path / "out")) == []
