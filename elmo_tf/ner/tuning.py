"""KerasTuner search over the ELMo task weights of the NER head (objective: dev span F1), resumable.

Searched per trial (same seed): the ScalarMix's initial gamma (0.01..10, log scale) and whether gamma is trained,
dropout (0.1..0.6), and the L2 on the mix weights (off, or 1e-4..1e-1 log scale). Without ELMo only dropout is
searched. A trial's score is its best epoch's `val_span_f1`, written into the epoch logs by `SpanF1Callback`, which
runs before the tuner's own callbacks.
"""

import json
import logging
import os
import time

from elmo_tf.ner.training import OBJECTIVE, fit_tagger, new_tagger

logger = logging.getLogger(__name__)

GAMMA_RANGE = (0.01, 10.0)
DROPOUT_RANGE = (0.1, 0.6)
MIX_L2_RANGE = (1e-4, 1e-1)
TUNERS = ("random", "bayesian")
SETTINGS_FILE = "tune_ner_settings.json"


class ResumeError(ValueError):
    """A project directory started with other search settings; the message lists the differences."""


class NoTrialError(ValueError):
    """The search ended without a trial that finished with a score."""


def hyperparameter_values(hp, use_elmo):
    """Declares the search space on `hp` and returns the `NERConfig` fields it picks."""
    values = {"dropout": hp.Float("dropout", *DROPOUT_RANGE)}
    if use_elmo:
        values["gamma"] = hp.Float("gamma", *GAMMA_RANGE, sampling="log")
        values["gamma_trainable"] = hp.Boolean("gamma_trainable", default=True)
        use_l2 = hp.Boolean("mix_l2_on", default=False)
        with hp.conditional_scope("mix_l2_on", [True]):
            mix_l2 = hp.Float("mix_l2", *MIX_L2_RANGE, sampling="log")
        values["mix_l2"] = mix_l2 if use_l2 else 0.0
    return values


def best_hyperparameters(hp_values, use_elmo):
    """The `NERConfig` fields of a finished trial's `hyperparameters.values`."""
    values = {"dropout": float(hp_values["dropout"])}
    if use_elmo:
        values.update(
            gamma=float(hp_values["gamma"]),
            gamma_trainable=bool(hp_values["gamma_trainable"]),
            mix_l2=float(hp_values["mix_l2"]) if hp_values.get("mix_l2_on") else 0.0,
        )
    return values


def _short(value):
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def make_hypermodel(config, data, trial_epochs):
    """A `keras_tuner.HyperModel` training `NERTagger`s on `data` (features shared by every trial)."""
    import keras_tuner

    use_elmo = data.num_layers > 0

    class NERHyperModel(keras_tuner.HyperModel):
        """Builds an NERTagger from the trial's hyperparameters; `fit` trains it on the shared features."""

        def build(self, hp):
            return new_tagger(config.replace(**hyperparameter_values(hp, use_elmo)), data)

        def fit(self, hp, model, *fit_args, callbacks=(), **kwargs):
            history, _ = fit_tagger(model, data, config, epochs=trial_epochs, callbacks=callbacks)
            curve = history.history.get(OBJECTIVE, [])
            logger.info(
                "trial: %s -> dev span F1 per epoch %s (best %.2f)",
                ", ".join(f"{k}={_short(v)}" for k, v in sorted(hp.values.items())),
                " ".join(f"{v:.2f}" for v in curve),
                max(curve, default=float("nan")),
            )
            return history

    return NERHyperModel()


def check_resume(project_dir, settings, overwrite=False):
    """Raises `ResumeError` when `project_dir` was started with other `settings` (a dict of the flags that define a
    search); returns the path where `record_settings` writes them."""
    path = os.path.join(project_dir, SETTINGS_FILE)
    if os.path.isfile(path) and not overwrite:
        with open(path, encoding="utf-8") as f:
            recorded = json.load(f)
        changed = [
            f"--{k.replace('_', '-')} {recorded.get(k)!r} -> {v!r}" for k, v in settings.items() if recorded.get(k) != v
        ]
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
    import keras_tuner

    from elmo_tf.io.atomic import write_json

    if tuner not in TUNERS:
        raise ValueError(f"tuner must be one of {TUNERS}, got {tuner!r}")
    project_dir = os.path.join(directory, project_name)
    settings_path = check_resume(project_dir, settings or {}, overwrite)
    tuner_class = keras_tuner.RandomSearch if tuner == "random" else keras_tuner.BayesianOptimization
    resuming = os.path.isfile(os.path.join(project_dir, "oracle.json")) and not overwrite
    try:
        search_tuner = tuner_class(
            make_hypermodel(config, data, trial_epochs),
            objective=keras_tuner.Objective(OBJECTIVE, direction="max"),
            max_trials=max_trials,
            seed=config.seed,
            directory=directory,
            project_name=project_name,
            overwrite=overwrite,
        )
    except (ValueError, TypeError) as e:
        if not resuming:  # nothing was read from the directory: the arguments are at fault, not the project
            raise
        raise ResumeError(f"cannot use the project in {project_dir!r}: {e}") from None
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
    best = best_hyperparameters(best_trial.hyperparameters.values, data.num_layers > 0)
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
