"""KerasTuner search over the ELMo task weights of the NER head, objective dev span F1; retrains the best trial.

Searched (per trial, the same seed): the ScalarMix's initial gamma (0.01..10, log scale) and whether gamma is
trained, dropout (0.1..0.6), and the L2 on the mix weights (off, or 1e-4..1e-1 log scale). With --no-elmo only
dropout is searched. Everything else is a flag, as in train_ner.py (same data and feature flags).

The ELMo features of train and dev are computed once (or read from --cache) and shared by all trials. The
objective is `val_span_f1` (span-level exact match, as conlleval), put into each epoch's logs by
`elmo_tf.ner.SpanF1Callback`, which runs before the tuner's own callbacks; a trial's score is its best epoch.

--directory holds the KerasTuner project (--project-name): running again with the same directory continues the
search (finished trials are kept, not rerun; --max-trials counts them too), as long as the search settings
(data, ELMo source, tuner, seed, model and trial flags) are the same; --overwrite starts over.
Then the best trial's hyperparameters are trained again for up to --epochs with early stopping on dev span F1
(--patience), and written like train_ner.py: OUTPUT/model.keras, encoder.json, metrics.json (dev/test scores,
best_hyperparameters, every trial), config.json (tag.py reads it).

examples:
  python training/tune_ner.py --train eng.train --dev eng.testa --test eng.testb --elmo runs/small \\
      --directory runs/tune --output runs/ner_tuned --max-trials 20 --cache runs/features.hdf5
  python training/tune_ner.py ... --tuner bayesian --max-trials 30          # Gaussian-process search
  python training/tune_ner.py ... --max-trials 40                          # same --directory: 20 more trials
  python training/tune_ner.py ... --overwrite                              # discard the project, start over
"""

import argparse
import json
import logging
import math
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

_HERE = os.path.dirname(os.path.abspath(__file__))
if __package__ in (None, ""):  # run as a script: make the repository (and training/) importable
    sys.path.insert(0, os.path.dirname(_HERE))
    sys.path.insert(1, _HERE)

from tag import OneLineParser  # noqa: E402  (training/tag.py)
from train_ner import load_features, new_tagger, read_splits, write_results  # noqa: E402  (training/train_ner.py)

OBJECTIVE = "val_span_f1"
GAMMA_RANGE = (0.01, 10.0)
DROPOUT_RANGE = (0.1, 0.6)
MIX_L2_RANGE = (1e-4, 1e-1)
SETTINGS_FILE = "tune_ner_settings.json"
# flags that define a search: a resumed project must have been started with the same values
SEARCH_FLAGS = (
    "train",
    "dev",
    "elmo",
    "elmo_server",
    "no_elmo",
    "model_name",
    "tuner",
    "seed",
    "tag_scheme",
    "crf_scheme",
    "trial_epochs",
    "patience",
    "batch_size",
    "learning_rate",
    "lstm_units",
    "no_word_features",
    "no_char_features",
    "max_sentences",
)

logger = logging.getLogger("tune_ner")


def build_parser():
    p = OneLineParser(
        prog="tune_ner.py",
        description=__doc__.split("\n")[0],
        epilog=__doc__.split("\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    data = p.add_argument_group("data and features (as train_ner.py)")
    data.add_argument("--train", required=True, help="training file (CoNLL-2003 or WNUT-17 format)")
    data.add_argument("--dev", required=True, help="the objective is span F1 on this file")
    data.add_argument("--test", default=None, help="scored once, with the retrained best model")
    source = data.add_mutually_exclusive_group(required=True)
    source.add_argument("--elmo", help="pretraining output dir, or a weights.hdf5 with options.json beside it")
    source.add_argument("--elmo-server", help="HOST:PORT of a model server with the ELMo export")
    source.add_argument("--no-elmo", action="store_true", help="no ELMo features (only dropout is searched)")
    data.add_argument("--model-name", default="elmo", help="model name on the server (elmo)")
    data.add_argument(
        "--tag-scheme",
        default="auto",
        choices=("auto", "iob1", "iob2", "bioes"),
        help="the files' scheme (auto: iob1 for 4 columns, else iob2)",
    )
    data.add_argument(
        "--crf-scheme",
        default="bioes",
        choices=("iob2", "bioes"),
        help="the scheme the CRF works in, with its constraints (bioes)",
    )
    data.add_argument("--no-word-features", action="store_true", help="drop the tagger's own word embedding")
    data.add_argument("--no-char-features", action="store_true", help="drop the tagger's own char CNN")
    data.add_argument("--cache", default=None, help="hdf5 file caching the ELMo features of the splits")
    data.add_argument("--max-sentences", type=int, default=0, help="use only the first N sentences of each file")
    search = p.add_argument_group("search")
    search.add_argument("--directory", required=True, help="KerasTuner results directory (resumable)")
    search.add_argument("--project-name", default="ner", help="project inside --directory (ner)")
    search.add_argument("--overwrite", action="store_true", help="delete the project and start over")
    search.add_argument(
        "--tuner",
        default="random",
        choices=("random", "bayesian"),
        help="RandomSearch or BayesianOptimization (random)",
    )
    search.add_argument("--max-trials", type=int, default=10, help="trials in all, resumed ones included (10)")
    search.add_argument("--trial-epochs", type=int, default=10, help="most epochs of one trial (10)")
    search.add_argument("--seed", type=int, default=1, help="tuner and training seed, > 0 (1)")
    training = p.add_argument_group("training (every trial and the retraining)")
    training.add_argument("--output", required=True, help="directory for the retrained best model")
    training.add_argument("--epochs", type=int, default=30, help="most epochs of the retraining (30)")
    training.add_argument("--patience", type=int, default=4, help="epochs without dev F1 gain before stopping")
    training.add_argument("--batch-size", type=int, default=32, help="sentences per batch (32)")
    training.add_argument("--learning-rate", type=float, default=1e-3, help="Adam learning rate (0.001)")
    training.add_argument("--lstm-units", type=int, default=200, help="biLSTM units per direction (200)")
    return p


def check_args(args, parser):
    for flag in ("train", "dev", "test"):
        path = getattr(args, flag)
        if path is not None and not os.path.isfile(path):
            parser.error(f"--{flag}: no such file: {path!r}")
    for flag in ("max_trials", "trial_epochs", "epochs", "patience", "batch_size", "lstm_units"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')}: must be >= 1, got {getattr(args, flag)}")
    if args.seed < 1:
        parser.error(f"--seed: must be > 0 (KerasTuner treats seed 0 as 'pick a random seed'), got {args.seed}")
    if not args.learning_rate > 0:
        parser.error(f"--learning-rate: must be > 0, got {args.learning_rate}")
    if args.max_sentences < 0:
        parser.error(f"--max-sentences: must be >= 0, got {args.max_sentences}")
    if args.no_elmo and args.no_word_features and args.no_char_features:
        parser.error("--no-elmo: with --no-word-features and --no-char-features the tagger has no features")


def search_settings(args):
    """The flags that define the search, paths made absolute (compared when a project is resumed)."""
    settings = {name: getattr(args, name) for name in SEARCH_FLAGS}
    for name in ("train", "dev", "elmo"):
        if settings[name]:
            settings[name] = os.path.abspath(settings[name])
    return settings


def check_resume(args, parser, project_dir):
    """Refuses to continue a project that was started with other search settings; records them for a new one."""
    path = os.path.join(project_dir, SETTINGS_FILE)
    settings = search_settings(args)
    if os.path.isfile(path) and not args.overwrite:
        with open(path, encoding="utf-8") as f:
            recorded = json.load(f)
        changed = [
            f"--{k.replace('_', '-')} {recorded.get(k)!r} -> {v!r}" for k, v in settings.items() if recorded.get(k) != v
        ]
        if changed:
            parser.error(
                f"--directory: the project {project_dir!r} was started with other search settings "
                f"({'; '.join(changed)}); use the same flags to resume, or --overwrite to start over"
            )
    return settings, path


# ------------------------------------------------------------------------------------------------ the search


def hyperparameter_values(hp, use_elmo):
    """Declares the search space on `hp` and returns the NERTagger arguments it picks."""
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
    """The NERTagger arguments of a finished trial's `hyperparameters.values`."""
    values = {"dropout": float(hp_values["dropout"])}
    if use_elmo:
        values.update(
            gamma=float(hp_values["gamma"]),
            gamma_trainable=bool(hp_values["gamma_trainable"]),
            mix_l2=float(hp_values["mix_l2"]) if hp_values.get("mix_l2_on") else 0.0,
        )
    return values


def make_tagger(args, encoder, num_layers, values):
    """A compiled NERTagger, built from a fresh Keras session and the seed: every trial and the retraining
    start from the same random state (the dropout layers draw their seeds when they are constructed)."""
    import keras

    keras.backend.clear_session()
    keras.utils.set_random_seed(args.seed)
    model = new_tagger(args, encoder, num_layers, **values)
    model.compile(optimizer=keras.optimizers.Adam(args.learning_rate, clipnorm=5.0))
    return model


def prepare_training(model, args, data, log=None):
    """Builds `model` (from `make_tagger`); returns (SpanF1Callback on dev, shuffled train batches) for `model.fit`."""
    from elmo_tf.ner import NERBatches, SpanF1Callback

    model.build_for(data["dim"])
    train_batches = NERBatches(
        data["splits"]["train"],
        data["encoder"],
        data["features"]["train"],
        batch_size=args.batch_size,
        shuffle=True,
        seed=args.seed,
        **data["inputs"],
    )
    span_f1 = SpanF1Callback(data["batches"]["dev"], patience=args.patience, log=log)
    return span_f1, train_batches


def make_hypermodel(args, data):
    import keras_tuner

    class NERHyperModel(keras_tuner.HyperModel):
        """Builds an NERTagger from the trial's hyperparameters; `fit` trains it on the shared features."""

        def build(self, hp):
            return make_tagger(args, data["encoder"], data["num_layers"], hyperparameter_values(hp, not args.no_elmo))

        def fit(self, hp, model, *fit_args, callbacks=(), **kwargs):
            span_f1, train_batches = prepare_training(model, args, data)
            # SpanF1Callback first: it writes val_span_f1 into the epoch logs that the tuner's callbacks
            # (TunerCallback, SaveBestEpoch) and History, which come after it, read.
            history = model.fit(train_batches, epochs=args.trial_epochs, callbacks=[span_f1, *callbacks], verbose=0)
            curve = history.history.get(OBJECTIVE, [])
            logger.info(
                "trial: %s -> dev span F1 per epoch %s (best %.2f)",
                ", ".join(f"{k}={_short(v)}" for k, v in sorted(hp.values.items())),
                " ".join(f"{v:.2f}" for v in curve),
                max(curve, default=float("nan")),
            )
            return history

    return NERHyperModel()


def _short(value):
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def trial_summaries(tuner):
    trials = []
    for trial in sorted(tuner.oracle.trials.values(), key=lambda t: t.trial_id):
        trials.append(
            {
                "trial_id": trial.trial_id,
                "status": str(trial.status),
                "score": trial.score,
                "best_step": trial.best_step,
                "hyperparameters": dict(trial.hyperparameters.values),
            }
        )
    return trials


# ------------------------------------------------------------------------------------------------ main


def prepare_data(args, parser):
    """Reads the splits, fits the label map, computes the ELMo features once; the dict every trial shares:
    splits, train (sentences), encoder, scheme, features {split: list or None}, batches (dev/test, unshuffled),
    inputs (use_words/use_chars), use_elmo, num_layers, dim, source_info. Errors go to `parser.error`."""
    import keras

    from elmo_tf.ner import NERBatches

    keras.utils.set_random_seed(args.seed)
    scheme, splits, encoder = read_splits(args, parser)
    logger.info(
        "%s; %d labels in %s",
        ", ".join(f"{k} {len(v)} sentences" for k, v in splits.items()),
        len(encoder.labels),
        args.crf_scheme,
    )

    source, source_info, features = load_features(args, parser, splits, logger)  # shared by all trials
    num_layers, dim = (source.num_layers, source.dim) if source is not None else (0, None)
    inputs = {"use_words": not args.no_word_features, "use_chars": not args.no_char_features}
    batches = {
        name: NERBatches(splits[name], encoder, features[name], batch_size=args.batch_size, shuffle=False, **inputs)
        for name in splits
        if name != "train"
    }
    return {
        "splits": splits,
        "encoder": encoder,
        "scheme": scheme,
        "features": features,
        "batches": batches,
        "inputs": inputs,
        "num_layers": num_layers,
        "dim": dim,
        "source_info": source_info,
    }


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    check_args(args, parser)
    project_dir = os.path.join(args.directory, args.project_name)
    settings, settings_path = check_resume(args, parser, project_dir)

    import keras_tuner

    data = prepare_data(args, parser)
    splits, encoder, batches = data["splits"], data["encoder"], data["batches"]
    scheme, use_elmo, num_layers = data["scheme"], not args.no_elmo, data["num_layers"]

    objective = keras_tuner.Objective(OBJECTIVE, direction="max")
    tuner_class = keras_tuner.RandomSearch if args.tuner == "random" else keras_tuner.BayesianOptimization
    resuming = os.path.isfile(os.path.join(project_dir, "oracle.json")) and not args.overwrite
    try:
        tuner = tuner_class(
            make_hypermodel(args, data),
            objective=objective,
            max_trials=args.max_trials,
            seed=args.seed,
            directory=args.directory,
            project_name=args.project_name,
            overwrite=args.overwrite,
        )
    except (ValueError, TypeError) as e:
        parser.error(f"--directory: cannot use the project in {project_dir!r}: {e}")
    os.makedirs(project_dir, exist_ok=True)
    with open(settings_path, "w", encoding="utf-8") as f:
        json.dump(settings, f, indent=2)
    done_before = sum(1 for t in tuner.oracle.trials.values() if t.status == "COMPLETED")
    logger.info(
        "%s %s search in %s: %d of %d trials done",
        "resuming the" if resuming else "new",
        args.tuner,
        project_dir,
        done_before,
        args.max_trials,
    )
    start = time.perf_counter()
    tuner.search(verbose=0)
    search_seconds = time.perf_counter() - start
    trials = trial_summaries(tuner)
    completed = [t for t in trials if t["status"] == "COMPLETED" and t["score"] is not None]
    if not completed:
        logger.error("no trial finished with a %s score; see %s", OBJECTIVE, project_dir)
        return 1
    best_trial = tuner.oracle.get_best_trials(1)[0]
    best = best_hyperparameters(best_trial.hyperparameters.values, use_elmo)
    logger.info(
        "%d new trials in %.1f s; best trial %s: dev span F1 %.2f with %s",
        len(completed) - done_before,
        search_seconds,
        best_trial.trial_id,
        best_trial.score,
        ", ".join(f"{k}={_short(v)}" for k, v in best.items()),
    )

    logger.info("retraining the best trial's hyperparameters for up to %d epochs", args.epochs)
    model = make_tagger(args, encoder, num_layers, best)
    span_f1, train_batches = prepare_training(model, args, data, log=logger.info)
    start = time.perf_counter()
    model.fit(train_batches, epochs=args.epochs, callbacks=[span_f1], verbose=0)
    metrics = {
        "best_epoch": span_f1.best_epoch + 1,
        "train_seconds": time.perf_counter() - start,
        "best_hyperparameters": best,
        "best_trial": {"trial_id": best_trial.trial_id, "score": best_trial.score},
        "search_seconds": search_seconds,
        "trials": trials,
    }
    config = dict(
        vars(args),
        tag_scheme_resolved=scheme,
        elmo_source=data["source_info"],
        dropout=best["dropout"],
        gamma=best.get("gamma", 1.0),
        fixed_gamma=not best.get("gamma_trainable", True),
        mix_l2=best.get("mix_l2", 0.0),
    )
    write_results(
        model, encoder, splits, batches, scheme, args.output, metrics, config, logger, json_default=_json_default
    )
    return 0


def _json_default(value):
    if hasattr(value, "item"):  # NumPy scalars
        return value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


if __name__ == "__main__":
    sys.exit(main())
