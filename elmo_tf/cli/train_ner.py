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
Writes (each file atomically): model.keras (the head), encoder.json (labels, scheme, word vocabulary),
metrics.json (dev and test overall and per type), config.json. Early stopping on dev span F1 (--patience), best
epoch kept. Exit status: 0 done, 2 bad command line, 1 bad data (the message names the flag, file and line).

The library does the work (elmo_tf.ner): this script parses flags and calls elmo_tf.ner.training.train_tagger.
"""

import argparse
import logging

from elmo_tf.cli import ArgumentParser, DataError, setup_logging
from elmo_tf.cli import ner as ner_cli

PROG = "train_ner.py"


def build_parser(prog=PROG):
    parser = ArgumentParser(
        prog=prog,
        description=__doc__.split("\n")[0],
        epilog=__doc__.split("\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ner_cli.add_data_flags(parser)
    ner_cli.add_training_flags(parser)
    return parser


def main(argv=None, prog=PROG):
    args = build_parser(prog).parse_args(argv)
    ner_cli.check_data_flags(args)
    config = ner_cli.config_from_args(args)
    setup_logging()
    log = logging.getLogger("train_ner")
    import keras

    from elmo_tf.ner.training import OutputError, train_tagger

    keras.utils.set_random_seed(config.seed)
    data = ner_cli.load_data_from_args(args)
    log.info(
        "%s; %d labels in %s: %s%s",
        ", ".join(f"{k} {len(v)} sentences" for k, v in data.splits.items()),
        len(data.encoder.labels),
        config.crf_scheme,
        " ".join(data.encoder.labels),
        ner_cli.features_text(args, data),
    )
    try:
        train_tagger(config, data, args.output, record=vars(args), log=log.info)
    except OutputError as e:  # a full disk
        raise DataError(f"--output: {e}") from None
    return 0
