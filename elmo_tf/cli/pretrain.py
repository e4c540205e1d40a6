"""Pretrains an ELMo biLM on text (sampled softmax, tf.distribute, checkpoints and resume, perplexity).

examples:
  python training/build_vocab.py --train 'corpus/*.txt' --output vocab.txt --min-count 3
  python training/pretrain.py --train 'corpus/*.txt' --vocab vocab.txt --config small --output runs/small \\
      --valid heldout.txt --steps 2000 --batch-size 64
  # two replicas on one CPU (logical devices), or all local GPUs with the default --strategy mirrored:
  python training/pretrain.py ... --cpu-replicas 2
  # two machines (or processes): TF_CONFIG on each, same command, --strategy multi_worker
  # continue from released or earlier weights on a new corpus:
  python training/pretrain.py ... --config options.json --init-from options.json weights.hdf5

Data: one sentence or paragraph per line, whitespace tokens; lines longer than --max-tokens are cut into
pieces trained as separate sentences (stateless, length-bucketed batches; see elmo_tf/preprocessing/
lm_dataset.py). Empty lines are skipped; invalid UTF-8 is kept byte for byte (unknown words -> <UNK>).

Stopping: after --steps / --epochs, or once --max-minutes of training wall time are spent (the run's
total, continued on resume; start-up and validation not counted): the model directory is written either way.

Faults: a checkpoint every --checkpoint-every steps, at the end, and on Ctrl-C (exit 130) or SIGTERM
(exit 143); rerunning the same command after any of these, a crash or `kill -9` resumes from the last
checkpoint with the step, optimizer state, training time and data position restored. A NaN/inf loss stops
the run (exit 3) and keeps the last good checkpoint. Bad flags (a number out of its range included): one error
line naming the flag and the value, exit 2. Training files without a token, a blank --valid file, a UTF-16 or
binary file: one line naming the flag and the file, exit 1, before anything is built.

Output DIR: options.json, weights.hdf5 (bilm-tf/AllenNLP layout, for `python -m elmo_tf embed`),
vocab.txt, softmax.hdf5 (softmax/W, softmax/b), metrics.json, train_config.json (all written atomically),
log.csv (one row per --log-every steps: epoch = step, step, loss, perplexity, tokens_per_s, elapsed_minutes,
val_perplexity), tensorboard/ (keras.callbacks.TensorBoard), checkpoints/.
"""

import argparse
import logging

from elmo_tf.bounds import Bounds, ConfigError, field_flag
from elmo_tf.cli import (
    MAX_THREADS,
    ArgumentParser,
    DataError,
    UsageError,
    bounded_number,
    check_output_dir,
    check_text_file,
    check_text_start,
    count_int,
    existing_file,
    field_type,
    glob_flag,
    number_type,
    setup_logging,
    threads_int,
)
from elmo_tf.cli.precision import COMPUTED, add_precision_flag, precision_text, resolved_precision
from elmo_tf.io.atomic import WriteError
from elmo_tf.io.vocabulary import Vocabulary
from elmo_tf.pretraining.config import OPTIMIZERS, CheckpointMismatchError, NonFiniteLossError, TrainConfig

PROG = "pretrain.py"

NON_FINITE_EXIT = 3


def build_parser(prog=PROG):
    p = ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", required=True, help="glob of training text files (quote it)")
    p.add_argument("--vocab", required=True, help="vocabulary from training/build_vocab.py")
    p.add_argument("--config", required=True, help="small | medium | original | an options.json file")
    p.add_argument("--output", required=True, help="run directory (created; reused to resume)")
    p.add_argument("--valid", default=None, type=existing_file("--valid"), help="held-out text file for perplexity")
    p.add_argument("--strategy", default="mirrored", choices=("mirrored", "multi_worker", "one_device"))
    p.add_argument(
        "--cpu-replicas",
        type=number_type("--cpu-replicas", Bounds(int, 1, MAX_THREADS, high_note="each is a device with its threads")),
        default=1,
        help="split the CPU into N logical devices (mirrored)",
    )
    length = p.add_mutually_exclusive_group(required=True)
    length.add_argument("--steps", type=count_int("--steps", minimum=1), default=0, help="training steps")
    length.add_argument(
        "--epochs",
        type=bounded_number("--epochs", float, minimum=0, minimum_inclusive=False),
        default=0.0,
        help="passes over the training data",
    )
    p.add_argument(
        "--max-minutes",
        type=bounded_number("--max-minutes", float, minimum=0, minimum_inclusive=False),
        default=None,
        help="stop after this much training wall time (the run's total; the model dir is written)",
    )

    def config_flag(field, **kwargs):  # a TrainConfig field's flag, range-checked as the dataclass checks it
        p.add_argument(field_flag(TrainConfig, field), type=field_type(TrainConfig, field), **kwargs)

    config_flag("batch_size", default=128, help="sentences per step over all replicas (128)")
    config_flag("max_tokens", default=50, help="cut longer lines into pieces (50)")
    p.add_argument("--optimizer", default="adagrad", choices=OPTIMIZERS)
    config_flag("learning_rate", default=None, help="default 0.2 (adagrad), 1e-3 (adam), 1.0 (sgd)")
    config_flag("clip_norm", default=10.0, help="global-norm gradient clipping (0: off)")
    config_flag("dropout", default=0.1, help="in [0, 1) (0.1)")
    config_flag("num_sampled", default=8192, help="sampled-softmax negatives (log-uniform)")
    config_flag("checkpoint_every", default=200, help="steps between checkpoints (200)")
    config_flag("log_every", default=10, help="steps between log lines (10)")
    config_flag("validate_every", default=0, help="steps between valid perplexities (0: at the end)")
    config_flag("shuffle_buffer", default=10000, help="sentences in the shuffle buffer (10000; 0: no shuffling)")
    config_flag("bucket_width", default=10, help="batch sentences by length in buckets this many tokens wide (10)")
    _add_precision_flags(p)
    config_flag("seed", default=0, help="data order and initial weights, 0 <= seed < 2**32 (0)")
    p.add_argument(
        "--init-from",
        nargs=2,
        metavar=("OPTIONS", "WEIGHTS"),
        type=existing_file("--init-from"),
        default=None,
        help="start from an existing biLM (bilm-tf/AllenNLP files)",
    )
    p.add_argument(
        "--threads", type=threads_int("--threads"), default=0, help="intra-op threads (0: TensorFlow's default)"
    )
    return p


def _add_precision_flags(parser):
    """--precision (auto: bfloat16 where this CPU multiplies it natively) and its older name --matmul-precision
    (float32 or bfloat16), one or the other: both set `TrainConfig.matmul_precision`, the dtype of the training step's
    LSTM and sampled-softmax matmuls."""
    what = (
        ": the dtype of the training step's LSTM and sampled-softmax matmuls; the weights, the optimizer and the "
        "evaluation stay float32"
    )
    group = parser.add_mutually_exclusive_group()
    add_precision_flag(group, default=None, what=f" (default float32){what}")
    group.add_argument(
        "--matmul-precision",
        choices=COMPUTED,
        default=None,
        help="the older name of --precision (float32 or bfloat16)",
    )


def _precision(args):
    """The matmul precision of the run (float32 or bfloat16): --precision (auto decided here, once) or
    --matmul-precision."""
    if args.matmul_precision is not None:
        return resolved_precision(args.matmul_precision, flag="--matmul-precision")
    return resolved_precision(args.precision)


def _configs(args):
    """(vocabulary, BiLMConfig, TrainConfig) of the flags; UsageError / DataError naming the flag."""
    from elmo_tf.config import BiLMConfig, get_config

    try:
        vocab = Vocabulary.load(args.vocab)
    except ValueError as e:
        raise UsageError(f"--vocab: {e}") from None
    try:
        bilm_config = BiLMConfig.from_json(args.config) if args.config.endswith(".json") else get_config(args.config)
    except ValueError as e:
        raise UsageError(f"--config: {e}") from None
    if args.init_from:
        try:
            init_config = BiLMConfig.from_json(args.init_from[0])
        except ValueError as e:
            raise DataError(f"--init-from: {e}") from None
        if init_config != bilm_config:
            raise UsageError(
                f"--init-from: options {args.init_from[0]!r} describe a different architecture than --config "
                f"{args.config!r}; pass the same options as --config"
            )
    lr = args.learning_rate or {"adagrad": 0.2, "adam": 1e-3, "sgd": 1.0}[args.optimizer]
    try:
        train_config = TrainConfig(
            batch_size=args.batch_size,
            max_tokens=args.max_tokens,
            steps=args.steps,
            epochs=args.epochs,
            optimizer=args.optimizer,
            learning_rate=lr,
            clip_norm=args.clip_norm,
            dropout=args.dropout,
            num_sampled=args.num_sampled,
            checkpoint_every=args.checkpoint_every,
            log_every=args.log_every,
            validate_every=args.validate_every,
            shuffle_buffer=args.shuffle_buffer,
            bucket_width=args.bucket_width,
            matmul_precision=_precision(args),
            seed=args.seed,
        )
    except ConfigError as e:  # the flags are range-checked already; what is left is how they combine
        raise UsageError(f"{field_flag(TrainConfig, e.key) or '--config'}: {e}") from None
    return vocab, bilm_config, train_config


def _check_data(args, train_files):
    """The output directory and the replicas (usage errors, exit 2), then the data (exit 1: a binary or UTF-16 file, a
    corpus without a token), before anything is built."""
    from elmo_tf.preprocessing.lm_dataset import LMDataError, check_has_tokens

    check_output_dir("--output", args.output)
    if args.strategy == "mirrored" and args.cpu_replicas > args.batch_size:
        raise UsageError(
            f"--cpu-replicas: {args.cpu_replicas} replicas for --batch-size {args.batch_size}: "
            "each replica needs a sentence of every batch"
        )
    for path in train_files:
        check_text_start("--train", path)
    try:
        check_has_tokens(train_files)
    except LMDataError as e:
        raise DataError(f"--train: {e}") from None
    if args.valid:
        check_text_file("--valid", args.valid, require_tokens=True)


def _strategy(args):
    """The tf.distribute strategy of --strategy (TensorFlow's threads and CPU replicas set first), the seed set."""
    import keras
    import tensorflow as tf

    from elmo_tf.pretraining.distribute import get_strategy, set_cpu_replicas

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    if args.strategy == "mirrored":
        set_cpu_replicas(args.cpu_replicas)
    try:
        strategy = get_strategy(args.strategy)
    except ValueError as e:
        raise UsageError(f"--strategy: {e}") from None
    keras.utils.set_random_seed(args.seed)
    if args.batch_size % strategy.num_replicas_in_sync:
        raise UsageError(
            f"--batch-size: {args.batch_size} does not divide evenly over {strategy.num_replicas_in_sync} replicas"
        )
    return strategy


def _trainer(args, strategy, vocab, bilm_config, train_config, train_files):
    """(Trainer, Checkpoints, total steps): restored from --output's checkpoints, else from --init-from."""
    from elmo_tf.pretraining import Checkpoints, Trainer, count_steps, load_initial_weights

    valid_files = [args.valid] if args.valid else None
    trainer = Trainer(strategy, bilm_config, train_config, vocab, train_files, valid_files=valid_files)
    checkpoints = Checkpoints(trainer, args.output)
    try:
        resumed = checkpoints.restore()
    except CheckpointMismatchError as e:
        raise UsageError(f"--output: {e}") from None
    if args.init_from and not resumed:
        try:
            load_initial_weights(trainer.model, vocab, *args.init_from)
        except ValueError as e:
            raise DataError(f"--init-from: {e}") from None
    try:
        total_steps = count_steps(train_config, train_files)
    except ConfigError as e:
        raise UsageError(f"{field_flag(TrainConfig, e.key)}: {e}") from None
    return trainer, checkpoints, total_steps


def main(argv=None, prog=PROG):
    args = build_parser(prog).parse_args(argv)
    train_files = glob_flag("--train", args.train)
    setup_logging()
    from elmo_tf.preprocessing.lm_dataset import LMDataError
    from elmo_tf.pretraining import run_pretraining

    vocab, bilm_config, train_config = _configs(args)
    _check_data(args, train_files)
    strategy = _strategy(args)  # sets TensorFlow's threads, the CPU replicas and the seed
    trainer, checkpoints, total_steps = _trainer(args, strategy, vocab, bilm_config, train_config, train_files)
    try:
        result = run_pretraining(trainer, checkpoints, total_steps, max_minutes=args.max_minutes)
    except NonFiniteLossError as e:
        logging.error("%s. Lower --learning-rate or --clip-norm.", e)
        return NON_FINITE_EXIT
    except WriteError as e:  # a full disk: what failed is removed, the previous checkpoints and files are kept
        raise DataError(f"--output: {e}") from None
    except LMDataError as e:  # a worker's share of the lines without a token
        raise DataError(f"--train: {e}") from None
    stopped = f" (stopped: {args.max_minutes:g} minutes)" if result["stop_reason"] == "stop_training" else ""
    valid = result.get("valid")
    logging.info(
        "done: step %d, train loss %.4f (perplexity %.2f), %.0f tokens/s, matmuls in %s%s%s",
        result["step"],
        result["loss"],
        result["perplexity"],
        result["tokens_per_s"],
        precision_text(trainer.config.matmul_precision, args.precision),
        stopped,
        "; valid perplexity forward {forward:.2f} backward {backward:.2f} average {average:.2f}".format(**valid)
        if valid
        else "",
    )
    return 0
