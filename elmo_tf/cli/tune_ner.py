"""KerasTuner search over the ELMo task weights of the NER head, objective dev span F1; retrains the best trial.

Searched (per trial, the same seed): the ScalarMix's initial gamma (0.01..10, log scale) and whether gamma is
trained, dropout (0.1..0.6), and the L2 on the mix weights (off, or 1e-4..1e-1 log scale). With --no-elmo only
dropout is searched. Everything else is a flag, as in train_ner.py (same data and feature flags).

The ELMo features of train and dev are computed once (or read from --cache) and shared by all trials. The
objective is `val_span_f1` (span-level exact match, as conlleval), put into each epoch's logs by
`elmo_tf.ner.training.SpanF1Callback`, which runs before the tuner's own callbacks; a trial's score is its best epoch.

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
import logging
import os

from elmo_tf.cli import (
    ArgumentParser,
    DataError,
    UsageError,
    check_output_dir,
    count_int,
    seed_int,
    setup_logging,
)
from elmo_tf.cli import ner as ner_cli

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

PROG = "tune_ner.py"

logger = logging.getLogger("tune_ner")


def build_parser(prog=PROG):
    p = ArgumentParser(
        prog=prog,
        description=__doc__.split("\n")[0],
        epilog=__doc__.split("\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ner_cli.add_data_flags(p, "data and features (as train_ner.py)")
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
    search.add_argument(
        "--max-trials",
        type=count_int("--max-trials", minimum=1),
        default=10,
        help="trials in all, resumed ones included (10)",
    )
    search.add_argument(
        "--trial-epochs", type=count_int("--trial-epochs", minimum=1), default=10, help="most epochs of one trial (10)"
    )
    search.add_argument(
        "--seed",
        type=seed_int("--seed", minimum=1),
        default=1,
        help="tuner and training seed, 0 < seed < 2**32: KerasTuner takes 0 as 'pick a random seed' (1)",
    )
    ner_cli.add_training_flags(p, "training (every trial and the retraining)", hyperparameters=False)
    return p


def search_settings(args):
    """The flags that define the search, paths made absolute, and the content (sha256) of the files --train, --dev
    and --elmo name (compared when a project is resumed: other data at the same path is another search)."""
    from elmo_tf.ner.tuning import CONTENT_SUFFIX, file_digest

    settings = {name: getattr(args, name) for name in SEARCH_FLAGS}
    for name in ("train", "dev", "elmo"):
        if settings[name]:
            settings[name] = os.path.abspath(settings[name])
    files = {}
    for flag, path in ner_cli.input_files(args):
        files.setdefault(flag[2:], []).append(path)
    for name in ("train", "dev", "elmo"):
        if name in files:
            settings[name + CONTENT_SUFFIX] = file_digest(*files[name])
    return settings


def check_project_dir(args, project_dir):
    """Raises UsageError when a file the command reads (or --cache) lies in the KerasTuner project directory, which
    the tuner writes and --overwrite deletes."""
    inside = os.path.realpath(project_dir) + os.sep
    files = ner_cli.input_files(args) + ([("--cache", args.cache)] if args.cache else [])
    for flag, path in files:
        if os.path.realpath(path).startswith(inside):
            raise UsageError(
                f"--directory: the project directory {project_dir!r} holds {flag} {path!r}; the tuner writes there "
                f"(--overwrite deletes it): move the file or give another --directory or --project-name"
            )


def main(argv=None, prog=PROG):
    args = build_parser(prog).parse_args(argv)
    ner_cli.check_data_flags(args)
    check_output_dir("--directory", args.directory)
    config = ner_cli.config_from_args(args)
    setup_logging()
    from elmo_tf.ner.training import OutputError, train_tagger
    from elmo_tf.ner.tuning import NoTrialError, ResumeError, check_resume, search

    project_dir = os.path.join(args.directory, args.project_name)
    check_project_dir(args, project_dir)
    settings = search_settings(args)
    try:
        check_resume(project_dir, settings, args.overwrite)  # before the features are computed
    except ResumeError as e:
        raise UsageError(f"--directory: {e}") from None
    data = ner_cli.load_data_from_args(args)  # shared by all trials
    logger.info(
        "%s; %d labels in %s%s",
        ", ".join(f"{k} {len(v)} sentences" for k, v in data.splits.items()),
        len(data.encoder.labels),
        config.crf_scheme,
        ner_cli.features_text(args, data),
    )
    try:
        best, summary = search(
            config,
            data,
            args.directory,
            args.project_name,
            args.tuner,
            args.max_trials,
            args.trial_epochs,
            args.overwrite,
            settings,
        )
    except ResumeError as e:
        raise UsageError(f"--directory: {e}") from None
    except NoTrialError as e:
        raise DataError(f"--directory: {e}") from None

    logger.info("retraining the best trial's hyperparameters for up to %d epochs", args.epochs)
    hp = summary["best_hyperparameters"]
    record = dict(
        vars(args),
        dropout=hp["dropout"],
        gamma=hp.get("gamma", 1.0),
        fixed_gamma=not hp.get("gamma_trainable", True),
        mix_l2=hp.get("mix_l2", 0.0),
    )
    try:
        train_tagger(best, data, args.output, record=record, log=logger.info, extra_metrics=summary)
    except OutputError as e:  # a full disk
        raise DataError(f"--output: {e}") from None
    return 0
