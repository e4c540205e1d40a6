"""training/tune_ner.py and elmo_tf.ner.tuning: the search space (declared once, in NERHyperModel.config_values, and
the reported best read back through it); SpanF1Callback's val_span_f1 reaches the tuner's callbacks; a 2-trial
KerasTuner search end to end (fixture ELMo in process, tiny CoNLL files, 2 epochs per trial) writes the retrained
best model and its hyperparameters; rerunning with the same --directory resumes (finished trials are not rerun);
changed search settings and seed 0 are refused.
"""

import json
import os
from pathlib import Path

import keras
import keras_tuner
import pytest
from ner_testlib import ALLENNLP, REPO_ROOT, error_line, run_cli, write_corpus

from elmo_tf.io.conll import read_conll
from elmo_tf.ner import span_scores, tuning
from elmo_tf.ner.training import NERConfig, NERData, load_data

TUNE = REPO_ROOT / "training" / "tune_ner.py"
TAG = REPO_ROOT / "training" / "tag.py"

SIZES = (("train", 30), ("dev", 10), ("test", 10))
COMMON = [
    "--trial-epochs",
    2,
    "--epochs",
    2,
    "--patience",
    3,
    "--lstm-units",
    16,
    "--batch-size",
    8,
    "--learning-rate",
    0.02,
    "--seed",
    3,
]


def search_args(paths, directory, output, max_trials, *extra):
    return [
        "--train",
        paths["train"],
        "--dev",
        paths["dev"],
        "--test",
        paths["test"],
        "--elmo",
        ALLENNLP / "lm_weights.hdf5",
        "--directory",
        directory,
        "--output",
        output,
        "--max-trials",
        max_trials,
        *COMMON,
        *extra,
    ]


def hypermodel_for(num_layers, data=None, trial_epochs=1, config=None):
    """An NERHyperModel; without `data`, one over no sentences, enough to declare the space of `num_layers`."""
    data = data or NERData("iob1", {}, None, {}, num_layers=num_layers)
    return tuning.NERHyperModel(config or NERConfig(), data, trial_epochs)


def trial_files(directory):
    project = Path(directory) / "ner"
    return {p.parent.name: p.read_bytes() for p in sorted(project.glob("trial_*/trial.json"))}


@pytest.fixture(scope="module")
def search(tmp_path_factory):
    if not (ALLENNLP / "lm_weights.hdf5").is_file():
        pytest.skip(f"{ALLENNLP} not found (the reference fixtures are not checked out)")
    root = tmp_path_factory.mktemp("tune_ner")
    paths = write_corpus(root, SIZES)
    result = run_cli(TUNE, *search_args(paths, root / "tuner", root / "best", 2, "--tuner", "bayesian"))
    assert result.returncode == 0, result.stderr[-4000:]
    return dict(
        root=root,
        paths=paths,
        directory=root / "tuner",
        output=root / "best",
        log=result.stderr,
        trials=trial_files(root / "tuner"),
    )


@pytest.mark.slow
def test_two_trial_search_writes_the_retrained_best_model(search):
    output, log = search["output"], search["log"]
    assert {"model.keras", "encoder.json", "metrics.json", "config.json"} <= set(os.listdir(output))
    metrics = json.loads((output / "metrics.json").read_text())
    best = metrics["best_hyperparameters"]
    assert set(best) == {"gamma", "gamma_trainable", "dropout", "mix_l2"}
    assert 0.01 <= best["gamma"] <= 10.0 and 0.1 <= best["dropout"] <= 0.6
    assert best["mix_l2"] == 0.0 or 1e-4 <= best["mix_l2"] <= 0.1
    trials = metrics["trials"]
    assert len(trials) == 2 and all(t["status"] == "COMPLETED" for t in trials)
    assert len({json.dumps(t["hyperparameters"], sort_keys=True) for t in trials}) == 2
    scores = [t["score"] for t in trials]
    assert metrics["best_trial"]["score"] == max(scores)
    # every trial and the retraining start from the same seed: the retraining (same epochs) reproduces the
    # best trial's dev F1, and the test scores are the retrained model's
    assert metrics["dev"]["f1"] == pytest.approx(metrics["best_trial"]["score"], abs=1e-9)
    assert set(metrics["test"]) == {"precision", "recall", "f1", "per_type"}
    # the tuner recorded val_span_f1 (from SpanF1Callback) as the objective of each trial
    for raw in search["trials"].values():
        trial = json.loads(raw)
        assert trial["status"] == "COMPLETED"
        observations = trial["metrics"]["metrics"]["val_span_f1"]["observations"]
        assert trial["score"] == pytest.approx(max(v for o in observations for v in o["value"]))
    # features computed once (not per trial), then shared
    for split in ("train", "dev", "test"):
        assert log.count(f"ELMo features for {split}:") == 1
    config = json.loads((output / "config.json").read_text())
    assert config["elmo_source"]["kind"] == "in_process"
    assert (config["gamma"], config["dropout"], config["mix_l2"]) == (best["gamma"], best["dropout"], best["mix_l2"])


@pytest.mark.slow
def test_tag_py_uses_the_tuned_model(search):
    """The tuned directory is a train_ner.py-style directory: tag.py reproduces its dev scores."""
    dev = read_conll(search["paths"]["dev"])
    result = run_cli(
        TAG, "--model", search["output"], "--format", "json", input="".join(" ".join(s.tokens) + "\n" for s in dev)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    predicted = [json.loads(line)["tags"] for line in result.stdout.splitlines()]
    metrics = json.loads((search["output"] / "metrics.json").read_text())
    assert span_scores([s.tags for s in dev], predicted, "iob1") == metrics["dev"]


@pytest.mark.slow
def test_rerun_resumes_the_same_project(search):
    """--max-trials 3 on the finished 2-trial project runs exactly one new trial; the old ones are untouched."""
    output = search["root"] / "best_resumed"
    result = run_cli(TUNE, *search_args(search["paths"], search["directory"], output, 3, "--tuner", "bayesian"))
    assert result.returncode == 0, result.stderr[-4000:]
    assert "resuming the bayesian search" in result.stderr and "2 of 3 trials done" in result.stderr
    assert "1 new trials" in result.stderr
    assert result.stderr.count("INFO trial:") == 1  # one trial trained, not three
    after = trial_files(search["directory"])
    assert len(after) == 3
    for name, raw in search["trials"].items():
        assert after[name] == raw, f"{name} was rerun or rewritten"
    metrics = json.loads((output / "metrics.json").read_text())
    assert len(metrics["trials"]) == 3


@pytest.mark.slow
def test_changed_settings_and_seed_zero_are_refused(search, tmp_path):
    changed = run_cli(
        TUNE, *search_args(search["paths"], search["directory"], tmp_path / "x", 3, "--tuner", "random"), timeout=60
    )
    assert changed.returncode == 2
    assert "--directory" in error_line(changed) and "--tuner" in error_line(changed)
    assert "--overwrite" in error_line(changed)
    seed0 = run_cli(TUNE, *search_args(search["paths"], tmp_path / "t", tmp_path / "x", 2), "--seed", 0, timeout=60)
    assert seed0.returncode == 2 and "--seed" in error_line(seed0)
    missing = run_cli(
        TUNE,
        "--train",
        tmp_path / "nope.txt",
        "--dev",
        search["paths"]["dev"],
        "--no-elmo",
        "--directory",
        tmp_path / "t",
        "--output",
        tmp_path / "x",
        timeout=60,
    )
    assert missing.returncode == 2 and "--train" in error_line(missing)


def test_search_space():
    hp = keras_tuner.HyperParameters()
    hypermodel = hypermodel_for(num_layers=3)
    values = hypermodel.config_values(hp)
    space = {p.name: p for p in hp.space}
    assert set(space) == {"dropout", "gamma", "gamma_trainable", "mix_l2_on", "mix_l2"}
    assert (space["gamma"].min_value, space["gamma"].max_value, space["gamma"].sampling) == (0.01, 10.0, "log")
    assert (space["dropout"].min_value, space["dropout"].max_value) == (0.1, 0.6)
    assert (space["mix_l2"].min_value, space["mix_l2"].max_value, space["mix_l2"].sampling) == (1e-4, 0.1, "log")
    assert values["mix_l2"] == 0.0 and values["gamma_trainable"] is True  # the defaults: L2 off
    # on a filled HyperParameters the same declarations read the values back by name
    hp.values.update(dropout=0.25, gamma=2.5, gamma_trainable=False, mix_l2_on=True, mix_l2=0.01)
    assert hypermodel.config_values(hp) == {"dropout": 0.25, "gamma": 2.5, "gamma_trainable": False, "mix_l2": 0.01}
    assert len(hp.space) == 5  # read, not declared again
    hp.values["mix_l2_on"] = False
    assert hypermodel.config_values(hp)["mix_l2"] == 0.0  # mix_l2 inactive
    plain = keras_tuner.HyperParameters()
    assert set(hypermodel_for(num_layers=0).config_values(plain)) == {"dropout"}
    assert [p.name for p in plain.space] == ["dropout"]


@pytest.mark.slow
def test_the_reported_best_agrees_with_the_declared_space(search):
    """The space the tuner searched (oracle.json) is the one `config_values` declares; every hyperparameter of it
    is in the best trial's values (when active) with a value in its range, and metrics.json's best_hyperparameters
    are those values."""
    metrics = json.loads((search["output"] / "metrics.json").read_text())
    best = metrics["best_hyperparameters"]
    oracle = json.loads((search["directory"] / "ner" / "oracle.json").read_text())
    searched = keras_tuner.HyperParameters.from_config(oracle["hyperparameters"])
    declared = keras_tuner.HyperParameters()
    hypermodel_for(num_layers=3).config_values(declared)
    assert {p.name: p.get_config() for p in searched.space} == {p.name: p.get_config() for p in declared.space}
    best_id = metrics["best_trial"]["trial_id"]
    searched.values = next(t["hyperparameters"] for t in metrics["trials"] if t["trial_id"] == best_id)
    for p in searched.space:
        if not searched.is_active(p):
            assert p.name not in searched.values and best[p.name] == 0.0  # mix_l2 with mix_l2_on off
            continue
        value = searched.values[p.name]
        if isinstance(p, keras_tuner.engine.hyperparameters.Boolean):
            assert isinstance(value, bool), (p.name, value)
        else:
            assert p.min_value <= value <= p.max_value, (p.name, value)
        if p.name != "mix_l2_on":  # the one hyperparameter that is no NERConfig field
            assert best[p.name] == value, p.name
    assert (best["mix_l2"] > 0) == searched.values["mix_l2_on"]
    assert set(best) == {p.name for p in searched.space} - {"mix_l2_on"}


@pytest.mark.slow
def test_the_report_reads_the_best_trial_through_the_one_declaration(tmp_path, monkeypatch):
    """A hyperparameter added to `config_values` reaches the reported best and the returned config, read from the very
    HyperParameters object `get_best_hyperparameters` returns: a second declaration of the space for the report
    (a hand-written reader of the trial's values) would miss it.

    The same one-trial search (2 epochs) also shows that the hypermodel's fit puts SpanF1Callback before the callbacks
    KerasTuner passes (TunerCallback, SaveBestEpoch): a recorder placed after them sees `val_span_f1` in every epoch's
    logs, equal to the History the oracle scores (formerly test_tuner_callbacks_see_val_span_f1)."""
    paths = write_corpus(tmp_path, (("train", 12), ("dev", 6)))
    data = load_data({"train": str(paths["train"]), "dev": str(paths["dev"])})
    declared, read, returned = tuning.NERHyperModel.config_values, [], []

    def with_probe(self, hp):
        read.append(hp)
        return {**declared(self, hp), "lstm_units": hp.Choice("lstm_units", [6])}

    get_best = keras_tuner.Tuner.get_best_hyperparameters

    def recording_get_best(self, num_trials=1):
        returned.extend(get_best(self, num_trials))
        return returned[-num_trials:]

    fit, fits = tuning.NERHyperModel.fit, []

    def recording_fit(self, hp, model, *args, callbacks=(), **kwargs):
        """Stands a LogRecorder after KerasTuner's own callbacks: what do they see in the logs?"""
        recorder = LogRecorder()
        history = fit(self, hp, model, *args, callbacks=[*callbacks, recorder], **kwargs)
        fits.append((list(callbacks), recorder, history))
        return history

    monkeypatch.setattr(tuning.NERHyperModel, "config_values", with_probe)
    monkeypatch.setattr(tuning.NERHyperModel, "fit", recording_fit)
    monkeypatch.setattr(keras_tuner.Tuner, "get_best_hyperparameters", recording_get_best)
    config = NERConfig(lstm_units=8, use_chars=False)
    best, summary = tuning.search(config, data, str(tmp_path / "tuner"), max_trials=1, trial_epochs=2)
    (trial,) = summary["trials"]
    assert summary["best_hyperparameters"] == {"dropout": trial["hyperparameters"]["dropout"], "lstm_units": 6}
    assert (best.lstm_units, best.dropout) == (6, trial["hyperparameters"]["dropout"])
    assert len(returned) == 1 and read[-1] is returned[0]  # the report is derived from that very object
    # the tuner's callbacks see val_span_f1
    ((tuner_callbacks, recorder, history),) = fits
    assert tuner_callbacks and all(isinstance(c, keras.callbacks.Callback) for c in tuner_callbacks)
    assert len(recorder.seen) == 2
    assert [logs["val_span_f1"] for logs in recorder.seen] == history.history["val_span_f1"]
    objective = keras_tuner.Objective("val_span_f1", "max")
    assert all(objective.has_value(logs) for logs in recorder.seen)
    assert trial["score"] == pytest.approx(max(history.history["val_span_f1"]))


class LogRecorder(keras.callbacks.Callback):
    """Placed after KerasTuner's own callbacks (which come after SpanF1Callback): the logs they see, epoch by epoch."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def on_epoch_end(self, epoch, logs=None):
        self.seen.append(dict(logs or {}))
