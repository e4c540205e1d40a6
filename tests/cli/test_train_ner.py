"""training/train_ner.py and training/tag.py end to end (subprocesses on tiny CoNLL files written here), and
elmo_tf.ner.span_scores against seqeval (conlleval counting) on random perturbations of the real tag sequences.

train_ner.py runs once per module (fixture ELMo in process, 2 epochs, biLSTM 16): model.keras, encoder.json,
metrics.json (dev and test, overall and per type), config.json. tag.py then tags the dev and test sentences
from that directory (conll from stdin, json from --input) and must reproduce metrics.json's scores exactly,
which it only does if it reloads the trained weights and the same ELMo.
"""

import json
import os
import shutil

import forked
import numpy as np
import pytest
from ner_testlib import (
    ALLENNLP,
    DATA_DIR,
    TAG,
    TRAIN_NER,
    error_line,
    free_port,
    run_cli,
    shared_converted_efml,
    write_corpus,
)
from seqeval.metrics import classification_report, f1_score, precision_score, recall_score

from elmo_tf.io.conll import read_conll
from elmo_tf.ner import span_scores
from elmo_tf.ner.tags import spans

# ------------------------------------------------------------------------------------------------ span_scores


def seqeval_scores(gold, predicted):
    report = classification_report(gold, predicted, output_dict=True, zero_division=0)
    per_type = {k: v for k, v in report.items() if not k.endswith(" avg")}
    return (
        100 * precision_score(gold, predicted, zero_division=0),
        100 * recall_score(gold, predicted, zero_division=0),
        100 * f1_score(gold, predicted, zero_division=0),
        per_type,
    )


def perturb(rng, tags, rate, types):
    out = list(tags)
    for i in range(len(out)):
        if rng.random() < rate:
            out[i] = "O" if rng.random() < 0.3 else f"{rng.choice(list('BIES'))}-{rng.choice(types)}"
    return out


@pytest.mark.parametrize(
    "relative,scheme,types",
    [
        ("conll2003/eng.testa", "iob1", ["PER", "LOC", "ORG", "MISC", "NEW"]),
        (
            "wnut17/emerging.dev.conll",
            "iob2",
            ["person", "location", "corporation", "product", "group", "creative-work", "other"],
        ),
    ],
)
def test_span_scores_equal_seqeval(relative, scheme, types):
    """Overall and per-type precision, recall, F1 and support, on the gold tags with 0-50 % of the tokens
    replaced by random O/B-/I-/E-/S- tags (a type absent from gold included)."""
    path = DATA_DIR / relative
    if not path.is_file():
        pytest.skip(f"{path} not found (the shared data is not checked out)")
    gold = [s.tags for s in read_conll(path)[:400]]
    rng = np.random.default_rng(0)
    for rate in (0.0, 0.03, 0.15, 0.5):
        predicted = [perturb(rng, g, rate, types) for g in gold]
        ours = span_scores(gold, predicted, scheme)
        precision, recall, f1, per_type = seqeval_scores(gold, predicted)
        assert ours["precision"] == pytest.approx(precision, abs=1e-9)
        assert ours["recall"] == pytest.approx(recall, abs=1e-9)
        assert ours["f1"] == pytest.approx(f1, abs=1e-9)
        assert set(ours["per_type"]) == set(per_type)
        for kind, expected in per_type.items():
            got = ours["per_type"][kind]
            assert got["support"] == expected["support"], kind
            for key, theirs in (("precision", "precision"), ("recall", "recall"), ("f1", "f1-score")):
                assert got[key] == pytest.approx(100 * expected[theirs], abs=1e-9), (rate, kind, key)
        if rate == 0.0:
            assert ours["f1"] == 100.0


def test_span_scores_edge_cases():
    assert span_scores([], [])["f1"] == 0.0
    nothing = span_scores([["O", "O"]], [["O", "O"]])
    assert (nothing["precision"], nothing["recall"], nothing["f1"], nothing["per_type"]) == (0.0, 0.0, 0.0, {})
    spurious = span_scores([["O", "O"]], [["B-PER", "O"]])
    assert spurious["per_type"]["PER"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0}
    half = span_scores([["B-PER", "I-PER", "O", "B-LOC"]], [["B-PER", "O", "O", "B-LOC"]])
    assert half["precision"] == half["recall"] == half["f1"] == 50.0  # a partly matched span counts as wrong
    with pytest.raises(ValueError, match="sentences"):
        span_scores([["O"]], [])
    with pytest.raises(ValueError, match="tags"):
        span_scores([["O"]], [["O", "O"]])


# ------------------------------------------------------------------------------------------------ train_ner.py


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    if not (ALLENNLP / "lm_weights.hdf5").is_file():
        pytest.skip(f"{ALLENNLP} not found (the reference fixtures are not checked out)")
    root = tmp_path_factory.mktemp("train_ner")
    paths = write_corpus(root)
    output = root / "ner"
    result = run_cli(
        TRAIN_NER,
        "--train",
        paths["train"],
        "--dev",
        paths["dev"],
        "--test",
        paths["test"],
        "--elmo",
        ALLENNLP / "lm_weights.hdf5",
        "--epochs",
        2,
        "--lstm-units",
        16,
        "--batch-size",
        8,
        "--learning-rate",
        0.02,
        "--output",
        output,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(paths=paths, output=output, log=result.stderr)


def test_train_ner_writes_model_labels_and_metrics(trained):
    output = trained["output"]
    assert {"model.keras", "encoder.json", "metrics.json", "config.json"} <= set(os.listdir(output))
    metrics = json.loads((output / "metrics.json").read_text())
    encoder = json.loads((output / "encoder.json").read_text())
    assert encoder["scheme"] == "bioes" and encoder["source_scheme"] == "iob1" and encoder["labels"][0] == "O"
    assert {"S-PER", "B-LOC", "E-LOC", "B-ORG"} <= set(encoder["labels"])
    assert metrics["best_epoch"] in (1, 2)
    for split in ("dev", "test"):
        scores = metrics[split]
        gold = [s.tags for s in read_conll(trained["paths"][split])]
        gold_counts = {}
        for tags in gold:
            for kind, _, _ in spans(tags, "iob1"):
                gold_counts[kind] = gold_counts.get(kind, 0) + 1
        assert set(gold_counts) <= set(scores["per_type"]) <= {"PER", "LOC", "ORG"}
        for kind, per in scores["per_type"].items():
            assert per["support"] == gold_counts.get(kind, 0)
            assert set(per) == {"precision", "recall", "f1", "support"}
        p, r = scores["precision"], scores["recall"]
        assert scores["f1"] == pytest.approx(2 * p * r / (p + r) if p + r else 0.0)
        assert 0.0 < scores["f1"] < 100.0  # 2 epochs: learning, not done (makes the tag.py checks below sharp)
    config = json.loads((output / "config.json").read_text())
    assert config["elmo_source"]["kind"] == "in_process" and config["tag_scheme_resolved"] == "iob1"
    assert "dev span F1" in trained["log"]
    n_train = len(read_conll(trained["paths"]["train"]))
    assert "ELMo features (train): 100%" in trained["log"] and f"{n_train}/{n_train}" in trained["log"]  # progress


def parse_conll_output(text):
    blocks = text.split("\n\n")
    assert blocks[-1] == "", "the output ends with a blank line"
    return [[line.split("\t") for line in block.split("\n")] for block in blocks[:-1]]


def test_tag_py_conll_from_stdin_reproduces_the_dev_scores(trained):
    """The dev sentences 22 times (264 sentences: a progress bar; other batch-mates, same tags)."""
    dev = read_conll(trained["paths"]["dev"])
    copies = 22
    text = "".join(" ".join(s.tokens) + "\n" for s in dev) * copies
    result = run_cli(TAG, "--model", trained["output"], input=text)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = parse_conll_output(result.stdout)
    assert len(rows) == copies * len(dev)
    assert [[token for token, _ in row] for row in rows] == [s.tokens for s in dev] * copies
    predicted = [[tag for _, tag in row] for row in rows]
    assert predicted == predicted[: len(dev)] * copies
    metrics = json.loads((trained["output"] / "metrics.json").read_text())
    assert span_scores([s.tags for s in dev], predicted[: len(dev)], "iob1") == metrics["dev"]
    assert f"{copies * len(dev)}/{copies * len(dev)}" in result.stderr  # the progress bar, on stderr


def test_tag_py_json_from_file_reproduces_the_test_scores(trained, tmp_path):
    test = read_conll(trained["paths"]["test"])
    lines = [" ".join(s.tokens) for s in test]
    (tmp_path / "in.txt").write_text("\n".join(lines[:5] + [""] + lines[5:]) + "\n", encoding="utf-8")
    result = run_cli(TAG, "--model", trained["output"], "--input", tmp_path / "in.txt", "--format", "json")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rows) == len(test) + 1
    assert rows[5] == {"tokens": [], "tags": [], "spans": []}  # an empty line is an empty sentence
    rows = rows[:5] + rows[6:]
    for row, s in zip(rows, test):
        assert row["tokens"] == s.tokens and len(row["tags"]) == len(s.tokens)
        assert [(x["type"], x["start"], x["end"]) for x in row["spans"]] == spans(row["tags"], "iob1")
        assert all(x["text"] == " ".join(s.tokens[x["start"] : x["end"]]) for x in row["spans"])
    metrics = json.loads((trained["output"] / "metrics.json").read_text())
    assert span_scores([s.tags for s in test], [r["tags"] for r in rows], "iob1") == metrics["test"]


def test_tag_py_errors_name_the_argument(trained, tmp_path):
    missing = run_cli(TAG, "--model", tmp_path / "nowhere", input="a b\n")
    assert missing.returncode == 2 and "--model" in error_line(missing) and "not a directory" in error_line(missing)
    (tmp_path / "empty").mkdir()
    empty = run_cli(TAG, "--model", tmp_path / "empty", input="a b\n")
    assert empty.returncode == 2 and "--model: no model.keras" in error_line(empty)
    no_input = run_cli(TAG, "--model", trained["output"], "--input", tmp_path / "missing.txt")
    assert no_input.returncode == 2 and "--input" in error_line(no_input)
    # the ELMo recorded in config.json is gone: the error says so and names --elmo
    moved = tmp_path / "ner"
    shutil.copytree(trained["output"], moved)
    config = json.loads((moved / "config.json").read_text())
    config["elmo_source"]["weights"] = str(tmp_path / "gone" / "weights.hdf5")
    (moved / "config.json").write_text(json.dumps(config))
    gone = run_cli(TAG, "--model", moved, input="a b\n")
    assert gone.returncode == 2, gone.stderr[-2000:]
    assert "--elmo" in error_line(gone) and "config.json" in error_line(gone) and gone.stdout == ""
    dead = run_cli(TAG, "--model", trained["output"], "--elmo-server", f"127.0.0.1:{free_port()}", input="a b\n")
    assert dead.returncode == 1 and "--elmo-server" in error_line(dead) and dead.stdout == ""
    assert all("Traceback" not in r.stderr for r in (missing, empty, no_input, gone, dead))
    help_text = run_cli(TAG, "--help")
    assert help_text.returncode == 0 and "examples:" in help_text.stdout and "--elmo-server" in help_text.stdout


def test_train_ner_bad_train_path_exits_2_naming_train(tmp_path):
    paths = write_corpus(tmp_path, sizes=(("dev", 2),))
    result = run_cli(
        TRAIN_NER,
        "--train",
        tmp_path / "missing.txt",
        "--dev",
        paths["dev"],
        "--no-elmo",
        "--output",
        tmp_path / "out",
        timeout=120,
    )
    assert result.returncode == 2
    assert "--train" in error_line(result) and "missing.txt" in error_line(result)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_train_ner_takes_dev_forms_train_lacks_and_tag_py_reloads_them(tmp_path, run_script):
    """Dev holds forms of the train types that train lacks (a two-token PER, a one-token LOC: refused before). The label
    set is every BIOES form of PER and LOC, the same in encoder.json, in model.keras and in the CRF's constraints
    after reloading; tag.py tags with it as the reloaded model does."""
    from elmo_tf.ner.tagging import load_tagger, tag_sentences
    from elmo_tf.ner.tags import allowed_transitions, labels_for

    train = tmp_path / "train.txt"
    train.write_text("Peter\tB-PER\nwent\tO\nto\tO\nNew\tB-LOC\nYork\tI-LOC\n\nAnna\tB-PER\n.\tO\n\n" * 3)
    dev = tmp_path / "dev.txt"
    dev.write_text("Peter\tB-PER\nBlackburn\tI-PER\nin\tO\nParis\tB-LOC\n\n")
    output = tmp_path / "ner"
    argv = ["--train", train, "--dev", dev, "--no-elmo", "--epochs", 2, "--lstm-units", 4, "--output", output]
    code, _, err = run_script(TRAIN_NER, argv)
    assert code == 0, err
    labels = labels_for({"PER", "LOC"}, "bioes")
    assert json.loads((output / "encoder.json").read_text())["labels"] == labels
    model, encoder, _ = load_tagger(str(output))
    assert model.labels == encoder.labels == labels and model.scheme == "bioes"
    trans, start, end = allowed_transitions(labels, "bioes")
    assert model.crf.allowed_transitions == trans.tolist() and model.crf.num_tags == len(labels)
    assert model.crf.allowed_start == start.tolist() and model.crf.allowed_end == end.tolist()
    (tmp_path / "in.txt").write_text("Peter Blackburn in Paris\nAnna went to New York .\n")
    code, out, err = run_script(TAG, ["--model", output, "--input", tmp_path / "in.txt", "--format", "json", "--quiet"])
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["tags"] for r in rows] == tag_sentences(model, encoder, [r["tokens"] for r in rows])


# ------------------------------------------------------------------------------------------------ a converted biLM


@pytest.mark.parametrize("precision", [None, "bfloat16"])
@pytest.mark.slow
def test_train_ner_tag_and_export_tagger_on_a_converted_elmoformanylangs_model(tmp_path, tmp_path_factory, precision):
    """`elmo-tf convert --from elmoformanylangs` output (char vocabulary + word column) as `--elmo`: `elmo-tf
    train-ner` trains on it, `elmo-tf tag` tags with the biLM its config.json records, `elmo-tf export-tagger` exports
    it (its own
    reload check passes), and the SavedModel's tags are `tag`'s. With `--precision bfloat16` (issue 51) the features
    are computed in bfloat16, and config.json, the feature cache and the export's metadata record it; tag and
    export-tagger take it from config.json (their default); without the flag every record says float32."""
    import h5py
    import tensorflow as tf

    from elmo_tf.ner import Encoder
    from elmo_tf.saved_model.metadata import read_export_metadata

    elmo_dir = shared_converted_efml(tmp_path_factory, "word")  # read only
    paths = write_corpus(tmp_path, sizes=(("train", 16), ("dev", 6), ("test", 6)))
    output, cache = tmp_path / "ner", tmp_path / "cache.hdf5"
    result = run_module(
        "train-ner",
        *("--train", paths["train"], "--dev", paths["dev"], "--test", paths["test"], "--elmo", elmo_dir),
        *("--epochs", 1, "--lstm-units", 8, "--batch-size", 8, "--output", output, "--cache", cache),
        *(("--precision", precision) if precision else ()),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    computed = precision or "float32"
    assert f"; ELMo features in {computed}" in result.stderr
    assert json.loads((output / "config.json").read_text())["elmo_source"]["precision"] == computed
    with h5py.File(cache, "r") as f:
        assert {f[split].attrs["precision"] for split in ("train", "dev", "test")} == {computed}
    dev = read_conll(paths["dev"])
    text = "".join(" ".join(s.tokens) + "\n" for s in dev)
    tagged = run_module("tag", "--model", output, "--format", "json", input=text)
    assert tagged.returncode == 0, tagged.stderr[-3000:]
    assert f", ELMo features in {computed})" in tagged.stderr  # training's, from config.json
    rows = [json.loads(line) for line in tagged.stdout.splitlines()]
    assert [row["tokens"] for row in rows] == [s.tokens for s in dev]
    if precision:  # another precision than training's is taken as asked, with a warning
        other = run_module("tag", "--model", output, "--format", "json", "--precision", "float32", input=text)
        assert other.returncode == 0 and len(other.stdout.splitlines()) == len(dev), other.stderr[-3000:]
        assert "the features are computed in float32, the tagger was trained on features computed in bfloat16" in (
            other.stderr
        )
    exported = run_module("export-tagger", "--ner", output, "--output", tmp_path / "tagger")
    assert exported.returncode == 0, exported.stderr[-3000:]
    (version,) = os.listdir(tmp_path / "tagger")
    metadata = read_export_metadata(str(tmp_path / "tagger" / version))
    assert (metadata["exporter"], metadata["precision"]) == ("ner_tagger", computed)
    out = tf.saved_model.load(str(tmp_path / "tagger" / version)).signatures["tag"](
        sentences=tf.constant([" ".join(s.tokens) for s in dev])
    )
    crf_tags = [[t.decode() for t in out["tags"][i, : len(s.tokens)].numpy()] for i, s in enumerate(dev)]
    encoder = Encoder.load(str(output / "encoder.json"))
    decoded = [encoder.decode_tags([encoder.label_ids[t] for t in tags]) for tags in crf_tags]
    assert decoded == [row["tags"] for row in rows]


def run_module(*args, input=None):
    """`python -m elmo_tf ARGS` in a subprocess, from this checkout (its PYTHONPATH)."""
    import sys
    from pathlib import Path

    from ner_testlib import subprocess_env

    return forked.run(
        [sys.executable, "-m", "elmo_tf", *map(str, args)],
        cwd=Path(__file__).resolve().parents[2],
        input=input,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
