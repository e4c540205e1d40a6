"""Trains the biLSTM-CRF NER head on ELMo features (in process or from a model server) or without ELMo.

examples:
  # features from a biLM in this process (a pretraining output dir, or weights.hdf5 with options.json beside)
  python training/train_ner.py --train eng.train --dev eng.testa --test eng.testb --elmo runs/small --output runs/ner
  # features over gRPC from serving/serve.py or TF Serving (the `tokens` signature)
  python training/train_ner.py --train T --dev D --test E --elmo-server localhost:8500 --output runs/ner_served
  # the same head without ELMo (own word embedding + char CNN only)
  python training/train_ner.py --train T --dev D --test E --no-elmo --output runs/ner_base

Formats: CoNLL-2003 (4 columns, IOB1, -DOCSTART-) and WNUT-17 (2 columns, IOB2); --tag-scheme names the
files' scheme (auto: iob1 when a file has 4 columns, else iob2). The CRF works in --crf-scheme (bioes) with
its transition constraints; metrics are span-level exact match (conlleval), in the files' scheme.
Writes: model.keras (the head), encoder.json (labels, scheme, word vocabulary), metrics.json (dev and test
overall and per type), config.json. Early stopping on dev span F1 (--patience), best epoch kept.
"""

import argparse
import json
import logging
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def build_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", required=True)
    p.add_argument("--dev", required=True)
    p.add_argument("--test", default=None)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--elmo", help="pretraining output dir, or a weights.hdf5 with options.json beside it")
    source.add_argument("--elmo-server", help="HOST:PORT of a model server with the ELMo export")
    source.add_argument("--no-elmo", action="store_true", help="no ELMo features (the baseline)")
    p.add_argument("--model-name", default="elmo", help="model name on the server (elmo)")
    p.add_argument("--output", required=True)
    p.add_argument("--tag-scheme", default="auto", choices=("auto", "iob1", "iob2", "bioes"))
    p.add_argument("--crf-scheme", default="bioes", choices=("iob2", "bioes"))
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--patience", type=int, default=4, help="epochs without dev F1 gain before stopping")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--lstm-units", type=int, default=200)
    p.add_argument("--gamma", type=float, default=1.0, help="initial ScalarMix gamma")
    p.add_argument("--fixed-gamma", action="store_true", help="do not train gamma")
    p.add_argument("--mix-l2", type=float, default=0.0, help="L2 on the ScalarMix weights")
    p.add_argument("--no-word-features", action="store_true", help="drop the tagger's own word embedding")
    p.add_argument("--no-char-features", action="store_true", help="drop the tagger's own char CNN")
    p.add_argument("--cache", default=None, help="hdf5 file caching the ELMo features of the three splits")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-sentences", type=int, default=0, help="use only the first N sentences of each file")
    return p


def detect_scheme(path):
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip() and not line.startswith("-DOCSTART-"):
                return "iob1" if len(line.split()) >= 4 else "iob2"
    return "iob2"


def read_splits(args, parser):
    """(files' tag scheme, {split: sentences}, Encoder): reads --train/--dev/--test, fits the label map on train
    and checks every dev/test label is known, with errors through `parser.error` naming the file or flag."""
    from elmo_tf.io.conll import ConllFormatError, read_conll
    from elmo_tf.ner import Encoder

    scheme = detect_scheme(args.train) if args.tag_scheme == "auto" else args.tag_scheme
    try:
        splits = {
            name: read_conll(path)
            for name, path in (("train", args.train), ("dev", args.dev), ("test", args.test))
            if path
        }
    except ConllFormatError as e:
        parser.error(str(e))
    if args.max_sentences:
        splits = {k: v[: args.max_sentences] for k, v in splits.items()}
    encoder = Encoder.fit(splits["train"], scheme, args.crf_scheme)
    for name, sentences in splits.items():  # an unknown dev/test label: a clear error now, not mid-training
        try:
            for s in sentences:
                encoder.encode_tags(s.tags)
        except ValueError as e:
            parser.error(f"--{name}: {e}")
    return scheme, splits, encoder


def load_features(args, parser, splits, log):
    """(source or None, source_info, {split: per-sentence activations or None}): opens --elmo / --elmo-server
    (errors through `parser.error` naming the flag) and computes each split's features once, through the
    --cache file, with a progress bar on stderr."""
    features, source_info = {k: None for k in splits}, {"kind": "none"}
    if args.no_elmo:
        return None, source_info, features
    from tag import open_feature_source
    from tqdm import tqdm

    from elmo_tf.ner import cached_features

    try:
        source, source_info = open_feature_source(
            elmo=args.elmo, elmo_server=args.elmo_server, model_name=args.model_name
        )
    except ValueError as e:
        parser.error(f"{'--elmo-server' if args.elmo_server else '--elmo'}: {e}")
    for name, sentences in splits.items():
        start = time.perf_counter()
        with tqdm(total=len(sentences), unit="sent", desc=f"ELMo features ({name})", file=sys.stderr) as bar:
            features[name] = cached_features(
                source,
                sentences,
                args.cache,
                key=name,
                source_info=json.dumps(source_info, sort_keys=True),
                progress=bar.update,
            )
        log.info("ELMo features for %s: %d sentences in %.1f s", name, len(sentences), time.perf_counter() - start)
    return source, source_info, features


def main(argv=None):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tag.py, beside this script
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    log = logging.getLogger("train_ner")
    for flag in ("train", "dev", "test"):
        path = getattr(args, flag)
        if path is not None and not os.path.isfile(path):
            parser.error(f"--{flag}: no such file: {path!r}")
    for flag in ("epochs", "batch_size", "lstm_units"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')}: must be >= 1, got {getattr(args, flag)}")
    if not 0 <= args.dropout < 1:
        parser.error(f"--dropout: must be in [0, 1), got {args.dropout}")
    if args.no_elmo and args.no_word_features and args.no_char_features:
        parser.error("--no-elmo: with --no-word-features and --no-char-features the tagger has no features")
    import keras

    from elmo_tf.ner import NERBatches, SpanF1Callback

    keras.utils.set_random_seed(args.seed)
    scheme, splits, encoder = read_splits(args, parser)
    log.info(
        "%s; %d labels in %s: %s",
        ", ".join(f"{k} {len(v)} sentences" for k, v in splits.items()),
        len(encoder.labels),
        args.crf_scheme,
        " ".join(encoder.labels),
    )
    source, source_info, features = load_features(args, parser, splits, log)
    use_words, use_chars = not args.no_word_features, not args.no_char_features
    batches = {
        name: NERBatches(
            sentences,
            encoder,
            features[name],
            batch_size=args.batch_size,
            shuffle=name == "train",
            use_words=use_words,
            use_chars=use_chars,
            seed=args.seed,
        )
        for name, sentences in splits.items()
    }
    model = new_tagger(
        args,
        encoder,
        0 if args.no_elmo else source.num_layers,
        dropout=args.dropout,
        gamma=args.gamma,
        gamma_trainable=not args.fixed_gamma,
        mix_l2=args.mix_l2,
    )
    model.build_for(None if args.no_elmo else source.dim)
    model.compile(optimizer=keras.optimizers.Adam(args.learning_rate, clipnorm=5.0))
    os.makedirs(args.output, exist_ok=True)
    callback = SpanF1Callback(batches["dev"], patience=args.patience, log=log.info)
    start = time.perf_counter()
    model.fit(batches["train"], epochs=args.epochs, callbacks=[callback], verbose=2)
    metrics = {"best_epoch": callback.best_epoch + 1, "train_seconds": time.perf_counter() - start}
    write_results(
        model,
        encoder,
        splits,
        batches,
        scheme,
        args.output,
        metrics,
        dict(vars(args), tag_scheme_resolved=scheme, elmo_source=source_info),
        log,
    )
    return 0


def new_tagger(args, encoder, num_layers, **values):
    """The NERTagger the data/feature flags describe (not built, not compiled); `values`: dropout, gamma,
    gamma_trainable, mix_l2."""
    from elmo_tf.models.ner_tagger import NERTagger

    return NERTagger(
        encoder.labels,
        args.crf_scheme,
        num_elmo_layers=num_layers,
        word_vocab_size=len(encoder.words) + 2 if not args.no_word_features else 0,
        char_filters=((3, 50),) if not args.no_char_features else (),
        lstm_units=args.lstm_units,
        **values,
    )


def write_results(model, encoder, splits, batches, scheme, output, metrics, config, log, json_default=None):
    """Scores dev/test (span F1 in the files' scheme) into `metrics`, then writes the output directory:
    model.keras, encoder.json, metrics.json, config.json."""
    from elmo_tf.ner import predict_tags, span_scores

    for name in ("dev", "test"):
        if name in batches:
            gold = [s.tags for s in splits[name]]
            metrics[name] = span_scores(gold, predict_tags(model, batches[name]), scheme)
            log.info(
                "%s span F1 %.2f (P %.2f R %.2f)",
                name,
                metrics[name]["f1"],
                metrics[name]["precision"],
                metrics[name]["recall"],
            )
    os.makedirs(output, exist_ok=True)
    model.save(os.path.join(output, "model.keras"))
    encoder.save(os.path.join(output, "encoder.json"))
    with open(os.path.join(output, "metrics.json"), "w", encoding="utf-8") as f:
        json.dump(metrics, f, indent=2, default=json_default)
    with open(os.path.join(output, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    log.info("wrote %s", output)


if __name__ == "__main__":
    sys.exit(main())
