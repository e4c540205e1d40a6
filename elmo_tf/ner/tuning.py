"""KerasTuner search over the ELMo task weights of the NER head (objective: dev span F1), resumable.

Searched per trial (same seed): the ScalarMix's initial gamma (0.01..10, log scale) and whether gamma is trained,
dropout (0.1..0.6), and the L2 on the mix weights (off, or 1e-4..1e-1 log scale). Without ELMo only dropout is
searched. The space is declared once, in `NERHyperModel.config_values` (what `build` calls); the best trial's values
are read back through it from `tuner.get_best_hyperparameters(1)[0]`. A trial's score is its best epoch's
`val_span_f1`, written into the epoch logs by `SpanF1Callback`, which runs before the tuner's own callbacks.
"""

import hashlib
import json
import logging
import os
import time

import keras_tuner

from elmo_tf.errors import ElmoTFError
from elmo_tf.ner.training import OBJECTIVE, fit_tagger, new_tagger

logger = logging.getLogger(__name__)

GAMMA_RANGE = (0.01, 10.0)
DROPOUT_RANGE = (0.1, 0.6)
MIX_L2_RANGE = (1e-4, 1e-1)
TUNERS = ("random", "bayesian")
SETTINGS_FILE = "tune_ner_settings.json"
CONTENT_SUFFIX = "_sha256"  # a setting holding the content digest of a flag's files


class ResumeError(ElmoTFError):
    """A project directory started with other search settings; the message lists the differences."""


class NoTrialError(ElmoTFError):
    """The search ended without a trial that finished with a score."""


def _short(value):
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class NERHyperModel(keras_tuner.HyperModel):
    """Trains `NERTagger`s on features shared by every trial; `config_values` is the search space, declared once.

    Args:
        config: the `NERConfig` every trial starts from (its searched fields are replaced per trial).
        data: `NERData` shared by the trials; the ELMo hyperparameters are searched only when it has ELMo features.
        trial_epochs: most epochs of one trial (early stopping on dev span F1 as in `fit_tagger`).
    """

    def __init__(self, config, data, trial_epochs, **kwargs):
        super().__init__(**kwargs)
        self.config, self.data, self.trial_epochs = config, data, trial_epochs
        self.use_elmo = data.num_layers > 0

    def config_values(self, hp):
        """The search space, as the `NERConfig` fields it sets: the only place it is declared.

        On a fresh `HyperParameters` (what `build` gets while the tuner learns the space) each hyperparameter is
        declared and takes its default; on a trial's (`tuner.get_best_hyperparameters(1)[0]`) the same calls read its
        values back by name. `mix_l2` exists only under `mix_l2_on`: off, the field is 0.0.
        """
        values = {"dropout": float(hp.Float("dropout", *DROPOUT_RANGE))}
        if self.use_elmo:
            values["gamma"] = float(hp.Float("gamma", *GAMMA_RANGE, sampling="log"))
            values["gamma_trainable"] = bool(hp.Boolean("gamma_trainable", default=True))
            use_l2 = hp.Boolean("mix_l2_on", default=False)
            with hp.conditional_scope("mix_l2_on", [True]):
                mix_l2 = hp.Float("mix_l2", *MIX_L2_RANGE, sampling="log")
            values["mix_l2"] = float(mix_l2) if use_l2 else 0.0
        return values

    def build(self, hp):
        return new_tagger(self.config.replace(**self.config_values(hp)), self.data)

    def fit(self, hp, model, *fit_args, callbacks=(), **kwargs):
        """Trains `model` on the shared features; KerasTuner's `callbacks` run after `SpanF1Callback`, so they see
        `val_span_f1` (the objective). Returns the History."""
        history, _ = fit_tagger(model, self.data, self.config, epochs=self.trial_epochs, callbacks=callbacks)
        curve = history.history.get(OBJECTIVE, [])
        logger.info(
            "trial: %s -> dev span F1 per epoch %s (best %.2f)",
            ", ".join(f"{k}={_short(v)}" for k, v in sorted(hp.values.items())),
            " ".join(f"{v:.2f}" for v in curve),
            max(curve, default=float("nan")),
        )
        return history


def file_digest(*paths):
    """sha256 (hex) of the bytes of `paths`, in order: the content a search ran on, whatever the files' names."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(f"{os.path.getsize(path)}:".encode())
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


def check_resume(project_dir, settings, overwrite=False):
    """Raises `ResumeError` when `project_dir` was started with other `settings` (a dict of the flags that define a
    search, and `<flag>_sha256`: the content of the files a flag names; a project recorded without one is not
    compared on it); returns the path where `record_settings` writes them."""
    path = os.path.join(project_dir, SETTINGS_FILE)
    if os.path.isfile(path) and not overwrite:
        with open(path, encoding="utf-8") as f:
            recorded = json.load(f)
        changed = []
        for key, value in settings.items():
            if key.endswith(CONTENT_SUFFIX):
                if key in recorded and recorded[key] != value:
                    flag = key[: -len(CONTENT_SUFFIX)].replace("_", "-")
                    changed.append(f"--{flag}: the content changed (sha256 {recorded[key][:12]}.. -> {value[:12]}..)")
            elif recorded.get(key) != value:
                changed.append(f"--{key.replace('_', '-')} {recorded.get(key)!r} -> {value!r}")
        if changed:
            raise ResumeError(
                f"the project {project_dir!r} was started with other search settings ({'; '.join(changed)}); "
                f"use the same flags to resume, or --overwrite to start over"
            )
    return path


def trial_summaries(tuner):
    return [
        {
            "trial_id": trial.trial_id,
            "status": str(trial.status),
            "score": trial.score,
            "best_step": trial.best_step,
            "hyperparameters": dict(trial.hyperparameters.values),
        }
        for trial in sorted(tuner.oracle.trials.values(), key=lambda t: t.trial_id)
    ]


def _open_tuner(tuner_class, hypermodel, max_trials, directory, project_name, overwrite, resuming):
    """`search`'s KerasTuner tuner over `hypermodel`; `ResumeError` when a resumed project cannot be used."""
    try:
        return tuner_class(
            hypermodel,
            objective=keras_tuner.Objective(OBJECTIVE, direction="max"),
            max_trials=max_trials,
            seed=hypermodel.config.seed,
            directory=directory,
            project_name=project_name,
            overwrite=overwrite,
        )
    except (ValueError, TypeError) as e:
        if not resuming:  # nothing was read from the directory: the arguments are at fault, not the project
            raise
        project_dir = os.path.join(directory, project_name)
        raise ResumeError(f"cannot use the project in {project_dir!r}: {e}") from None


def search(
    config,
    data,
    directory,
    project_name="ner",
    tuner="random",
    max_trials=10,
    trial_epochs=10,
    overwrite=False,
    settings=None,
):
    """Runs (or resumes) the search; returns (best `NERConfig`, summary dict: best trial, trials, counts).

    Args:
        config: the `NERConfig` every trial starts from (its searched fields are replaced per trial).
        data: `NERData` shared by the trials.
        directory, project_name: the KerasTuner project (resumable: finished trials are kept, not rerun).
        settings: the flags that define the search; a resumed project must have been started with the same.
    Raises:
        ResumeError: see `check_resume`, or a project KerasTuner cannot reload. NoTrialError: no trial finished with
            a score.
    """
    from elmo_tf.io.atomic import write_json

    if tuner not in TUNERS:
        raise ValueError(f"tuner must be one of {TUNERS}, got {tuner!r}")
    project_dir = os.path.join(directory, project_name)
    settings_path = check_resume(project_dir, settings or {}, overwrite)
    tuner_class = keras_tuner.RandomSearch if tuner == "random" else keras_tuner.BayesianOptimization
    resuming = os.path.isfile(os.path.join(project_dir, "oracle.json")) and not overwrite
    hypermodel = NERHyperModel(config, data, trial_epochs)
    search_tuner = _open_tuner(tuner_class, hypermodel, max_trials, directory, project_name, overwrite, resuming)
    os.makedirs(project_dir, exist_ok=True)
    write_json(settings_path, settings or {})
    done_before = sum(1 for t in search_tuner.oracle.trials.values() if t.status == "COMPLETED")
    logger.info(
        "%s %s search in %s: %d of %d trials done",
        "resuming the" if resuming else "new",
        tuner,
        project_dir,
        done_before,
        max_trials,
    )
    start = time.perf_counter()
    search_tuner.search(verbose=0)
    seconds = time.perf_counter() - start
    trials = trial_summaries(search_tuner)
    if not any(t["status"] == "COMPLETED" and t["score"] is not None for t in trials):
        raise NoTrialError(f"no trial finished with a {OBJECTIVE} score; see {project_dir}")
    best_trial = search_tuner.oracle.get_best_trials(1)[0]
    best = hypermodel.config_values(search_tuner.get_best_hyperparameters(1)[0])  # read back through the one space
    new_trials = sum(1 for t in trials if t["status"] == "COMPLETED") - done_before
    logger.info(
        "%d new trials in %.1f s; best trial %s: dev span F1 %.2f with %s",
        new_trials,
        seconds,
        best_trial.trial_id,
        best_trial.score,
        ", ".join(f"{k}={_short(v)}" for k, v in best.items()),
    )
    summary = {
        "best_hyperparameters": best,
        "best_trial": {"trial_id": best_trial.trial_id, "score": best_trial.score},
        "trials": trials,
        "new_trials": new_trials,
        "search_seconds": seconds,
    }
    return config.replace(**best), summary
