"""The flags train_ner.py and tune_ner.py share (data, ELMo features, the head) and their translation into
`NERConfig` / `NERData`, with errors under the `elmo_tf.cli` contract (the flag, the file, the line)."""

import logging
import os
import sys

from elmo_tf.cli import (
    DataError,
    UsageError,
    bounded_number,
    check_output_dir,
    check_output_file,
    count_int,
    existing_file,
    seed_int,
    size_int,
)
from elmo_tf.cli.precision import add_precision_flag, precision_text, resolved_precision

logger = logging.getLogger(__name__)


def add_data_flags(parser, group_title=None):
    """--train/--dev/--test, the ELMo source (--elmo | --elmo-server | --no-elmo), schemes, the head's own features,
    --cache and --max-sentences."""
    data = parser.add_argument_group(group_title) if group_title else parser
    data.add_argument("--train", required=True, type=existing_file("--train"), help="training file (CoNLL format)")
    data.add_argument("--dev", required=True, type=existing_file("--dev"), help="early stopping on span F1 here")
    data.add_argument("--test", default=None, type=existing_file("--test"), help="scored once, at the end")
    source = data.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--elmo",
        help="pretraining output dir, or a weights.hdf5 with options.json beside it, or a released model's name or "
        "URL (`elmo-tf models`; downloaded once into the cache)",
    )
    source.add_argument("--elmo-server", help="HOST:PORT of a model server with the ELMo export")
    source.add_argument("--no-elmo", action="store_true", help="no ELMo features (the baseline)")
    add_precision_flag(
        data,
        default=None,
        what=" of the --elmo biLM's features (default float32; recorded in config.json, where tag.py takes it from)",
    )
    data.add_argument("--model-name", default="elmo", help="model name on the server (elmo)")
    add_server_flags(data)
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
    data.add_argument(
        "--cache",
        default=None,
        help="hdf5 file caching the ELMo features of the splits: created, or a cache an earlier run wrote (any "
        "other file is refused, never replaced)",
    )
    data.add_argument(
        "--max-sentences",
        type=count_int("--max-sentences"),
        default=0,
        help="use only the first N sentences of each file (0: all)",
    )


def add_server_flags(parser):
    """--server-max-tokens: the request budget of a feature server (train_ner.py, tune_ner.py, tag.py)."""
    parser.add_argument(
        "--server-max-tokens",
        type=size_int("--server-max-tokens"),
        default=None,
        help="with --elmo-server: at most this many tokens (sentences x the longest) per request; default 16384, "
        "lowered to the limits the server names when it refuses a request",
    )
    parser.add_argument(
        "--elmo-server-ca", help="with --elmo-server on TLS: PEM file of the CAs to trust (the system's)"
    )
    parser.add_argument("--elmo-server-cert", help="with --elmo-server on mutual TLS: this client's PEM certificate")
    parser.add_argument("--elmo-server-key", help="with --elmo-server on mutual TLS: this client's PEM private key")


def server_credentials(args, server):
    """The `grpc.ChannelCredentials` of --elmo-server-ca/-cert/-key for `server` (the feature server's address, or
    None when the features are computed in process), or None (plaintext); UsageError naming the flag."""
    given = {flag: getattr(args, flag[2:].replace("-", "_"), None) for flag in TLS_FLAGS}
    if not any(given.values()):
        return None
    if not server:
        raise UsageError(f"{next(f for f, v in given.items() if v)}: only with --elmo-server")
    from elmo_tf.serving.client import tls_credentials

    try:
        return tls_credentials(*given.values())
    except ValueError as e:
        name = str(e).split(":", 1)[0]
        raise UsageError(f"--elmo-server-{name if name in ('ca', 'cert', 'key') else 'cert'}: {e}") from None


TLS_FLAGS = ("--elmo-server-ca", "--elmo-server-cert", "--elmo-server-key")


def add_training_flags(parser, group_title=None, hyperparameters=True):
    """--output, --epochs, --patience, --batch-size, --learning-rate, --lstm-units (and, unless they are searched,
    --dropout, --gamma, --fixed-gamma, --mix-l2, --mix-layer-norm, --seed)."""
    group = parser.add_argument_group(group_title) if group_title else parser
    group.add_argument("--output", required=True, help="directory for model.keras, encoder.json, metrics.json, ...")
    group.add_argument("--epochs", type=count_int("--epochs", minimum=1), default=30, help="most epochs (30)")
    group.add_argument(
        "--patience",
        type=count_int("--patience", minimum=1),
        default=4,
        help="epochs without dev F1 gain before stopping (4)",
    )
    group.add_argument("--batch-size", type=size_int("--batch-size"), default=32, help="sentences per batch (32)")
    group.add_argument(
        "--learning-rate",
        type=bounded_number("--learning-rate", float, minimum=0, minimum_inclusive=False),
        default=1e-3,
        help="Adam learning rate (0.001)",
    )
    group.add_argument(
        "--lstm-units", type=size_int("--lstm-units"), default=200, help="biLSTM units per direction (200)"
    )
    if hyperparameters:
        group.add_argument(
            "--dropout",
            type=bounded_number("--dropout", float, minimum=0, maximum=1, maximum_inclusive=False),
            default=0.5,
            help="dropout on the features and the biLSTM output, in [0, 1) (0.5)",
        )
        group.add_argument(
            "--gamma",
            type=bounded_number("--gamma", float, minimum=0, minimum_inclusive=False),
            default=1.0,
            help="initial ScalarMix gamma (1.0)",
        )
        group.add_argument("--fixed-gamma", action="store_true", help="do not train gamma")
        group.add_argument(
            "--mix-l2",
            type=bounded_number("--mix-l2", float, minimum=0),
            default=0.0,
            help="L2 on the ScalarMix weights (0)",
        )
        group.add_argument("--mix-layer-norm", action="store_true", help="layer-normalize each biLM layer in the mix")
        group.add_argument(
            "--seed", type=seed_int("--seed"), default=1, help="weights, dropout and batch order, < 2**32 (1)"
        )


def input_files(args):
    """(flag, path) of every file the command reads: the splits and the biLM's options and weights."""
    inputs = [(f"--{split}", getattr(args, split)) for split in ("train", "dev", "test")]
    if args.elmo:
        from elmo_tf.ner.features import elmo_paths

        inputs += [("--elmo", path) for path in elmo_paths(args.elmo)]
    return [(flag, path) for flag, path in inputs if path]


def check_data_flags(args):
    """What can be checked before any file is read; raises UsageError naming the flag. No output may be an input:
    neither --cache nor a file of --output is (a link to) a file the command reads, --output is not the biLM's
    directory (a pretraining run's metrics.json would be replaced), and --cache is absent or a cache written by an
    earlier run (`elmo_tf.ner.feature_cache.check_cache_path`)."""
    from elmo_tf.cli.models import resolve_elmo_flag
    from elmo_tf.ner.feature_cache import FeatureCacheError, check_cache_path
    from elmo_tf.ner.training import OUTPUT_FILES

    resolve_elmo_flag(args)
    if args.precision is not None and not args.elmo:
        why = (
            "--elmo-server computes in the precision of its export (elmo-tf export --precision)"
            if args.elmo_server
            else "--no-elmo has no biLM"
        )
        raise UsageError(f"--precision: only with --elmo (a biLM in this process); {why}")
    inputs = input_files(args)
    for flag, path in inputs:
        if flag == "--elmo" and not os.path.isfile(path):
            raise UsageError(f"--elmo: no {os.path.basename(path)} at {path!r}")
    if args.no_elmo and args.no_word_features and args.no_char_features:
        raise UsageError("--no-elmo: with --no-word-features and --no-char-features the tagger has no features")
    check_output_dir("--output", args.output)
    if args.elmo and os.path.isdir(args.output):
        elmo_dir = os.path.dirname(os.path.abspath(inputs[-1][1]))
        if os.path.samefile(args.output, elmo_dir):
            raise UsageError(
                f"--output: {args.output!r} is the biLM's directory (--elmo); the tagger's files would replace its "
                f"own (metrics.json); give another directory"
            )
    outputs = [os.path.join(args.output, name) for name in OUTPUT_FILES]
    for path in outputs:
        if os.path.exists(path):
            check_output_file("--output", path, inputs)
    if args.cache:
        if os.path.isdir(args.cache):
            raise UsageError(f"--cache: is a directory: {args.cache!r}")
        check_output_dir("--cache", os.path.dirname(os.path.abspath(args.cache)))  # created when missing
        for flag, path in inputs:
            if os.path.exists(args.cache) and os.path.samefile(args.cache, path):
                raise UsageError(f"--cache: {args.cache!r} is the same file as {flag} {path!r}; it would be destroyed")
        if os.path.realpath(args.cache) in {os.path.realpath(path) for path in outputs}:
            raise UsageError(f"--cache: {args.cache!r} is a file --output writes ({os.path.basename(args.cache)})")
        try:
            check_cache_path(args.cache)
        except FeatureCacheError as e:
            raise UsageError(f"--cache: {e}") from None


def config_from_args(args, **overrides):
    """The `NERConfig` the flags describe (searched fields may come in `overrides`)."""
    from elmo_tf.ner.training import NERConfig

    values = dict(
        crf_scheme=args.crf_scheme,
        use_words=not args.no_word_features,
        use_chars=not args.no_char_features,
        lstm_units=args.lstm_units,
        epochs=args.epochs,
        patience=args.patience,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        seed=args.seed,
    )
    for name in ("dropout", "gamma", "mix_l2", "mix_layer_norm"):
        if hasattr(args, name):
            values[name] = getattr(args, name)
    if hasattr(args, "fixed_gamma"):
        values["gamma_trainable"] = not args.fixed_gamma
    values.update(overrides)
    try:
        return NERConfig(**values)
    except ValueError as e:
        raise UsageError(str(e)) from None


def features_text(args, data):
    """What the commands' first log line says of the ELMo features of `data` (`load_data_from_args`): "" without,
    "; ELMo features from HOST:PORT" for a server's, "; ELMo features in bfloat16" (the precision a biLM in this
    process computed them in, `precision_text`)."""
    info = getattr(data, "source_info", None) or {}
    if args.no_elmo or not info:
        return ""
    if info.get("kind") == "server":
        return f"; ELMo features from {info.get('address')}"
    return f"; ELMo features in {precision_text(info.get('precision', 'float32'), args.precision)}"


def _progress_bar(split, total):
    from tqdm import tqdm

    return tqdm(total=total, unit="sent", desc=f"ELMo features ({split})", file=sys.stderr)


def load_data_from_args(args):
    """Reads the splits (DataError naming the flag, file and line), then opens the feature source of --elmo /
    --elmo-server (DataError naming the flag) and computes the features once (progress bars on stderr)."""
    from elmo_tf.ner.data import NERDataError
    from elmo_tf.ner.feature_cache import FeatureCacheError
    from elmo_tf.ner.features import FeatureSourceError, SentenceTooLongError, open_feature_source
    from elmo_tf.ner.training import add_features, load_data

    paths = {"train": args.train, "dev": args.dev, "test": args.test}
    try:
        data = load_data(paths, args.tag_scheme, args.crf_scheme, args.max_sentences)
    except NERDataError as e:
        raise DataError(f"--{e.split}: {e}") from None
    if args.no_elmo:
        return data
    try:
        source, source_info = open_feature_source(
            elmo=args.elmo,
            elmo_server=args.elmo_server,
            model_name=args.model_name,
            max_request_tokens=args.server_max_tokens,
            credentials=server_credentials(args, args.elmo_server),
            precision=resolved_precision(args.precision) if args.elmo else None,
        )
    except FeatureSourceError as e:  # weights that do not load, a server that does not answer
        raise DataError(f"{'--elmo-server' if args.elmo_server else '--elmo'}: {e}") from None
    try:
        return add_features(data, source, source_info, args.cache, progress=_progress_bar)
    except SentenceTooLongError as e:
        raise DataError(f"--{e.split}: {paths[e.split]}:{e.line}: {e} (--elmo-server {args.elmo_server})") from None
    except FeatureCacheError as e:  # a full disk; a file put at the path since the check
        raise DataError(f"--cache: {e}") from None
