"""`elmo-tf`: one command with a subcommand for every job. Each subcommand is a module of `elmo_tf.cli` with its own
parser and `main(argv, prog)`; the module is imported only when its subcommand runs, and none of them imports
TensorFlow before its flags are parsed, so `elmo-tf --help`, `elmo-tf SUBCOMMAND --help` and usage errors answer
at once. `python -m elmo_tf` is the same command; `training/*.py`, `export/*.py` and `serving/serve.py` run the same
`main` functions under their own names.

    elmo-tf embed --options options.json --weights weights.hdf5 --input sentences.txt --output out.hdf5
    elmo-tf pretrain --help
"""

import argparse
import importlib
import os
import sys

from elmo_tf.cli import ArgumentParser, run

PROG = "elmo-tf"

# subcommand -> (module, its main function, one line of help)
COMMANDS = {
    "embed": ("elmo_tf.cli.embed", "main", "write ELMo activations for every line of a text file to hdf5"),
    "dump-token-embeddings": (
        "elmo_tf.cli.embed",
        "dump_main",
        "write the context-free (char CNN) vector of every vocabulary word to hdf5",
    ),
    "build-vocab": ("elmo_tf.cli.build_vocab", "main", "count a corpus into a biLM vocabulary"),
    "pretrain": ("elmo_tf.cli.pretrain", "main", "pretrain a biLM (checkpoints, resume, perplexity)"),
    "evaluate-lm": ("elmo_tf.cli.evaluate_lm", "main", "full-softmax perplexity of a pretrained biLM"),
    "score": ("elmo_tf.cli.score", "main", "per-token log-probabilities and top-k words of a file under a biLM"),
    "export": ("elmo_tf.cli.export", "main", "export ELMo as a versioned SavedModel for TF Serving"),
    "export-tagger": ("elmo_tf.cli.export_tagger", "main", "export the NER tagger with its ELMo as one SavedModel"),
    "serve": ("elmo_tf.cli.serve", "main", "serve SavedModel exports over gRPC and REST"),
    "train-ner": ("elmo_tf.cli.train_ner", "main", "train the NER tagger on CoNLL files"),
    "tune-ner": ("elmo_tf.cli.tune_ner", "main", "search the NER tagger's hyperparameters (KerasTuner)"),
    "tag": ("elmo_tf.cli.tag", "main", "tag sentences with a trained NER tagger"),
    "beam-embed": (
        "elmo_tf.cli.beam_embed",
        "main",
        "embed a text file into hdf5 shards with an Apache Beam pipeline (DirectRunner, Dataflow, Flink, Spark)",
    ),
    "merge-shards": ("elmo_tf.cli.merge_shards", "main", "merge the shards of beam-embed into one embed output"),
    "models": ("elmo_tf.cli.models", "main", "list the released ELMo models (by name) and what the cache holds"),
    "download": ("elmo_tf.cli.models", "download_main", "download released ELMo models into the cache (offline later)"),
    "convert": (
        "elmo_tf.cli.convert",
        "main",
        "convert a bilm-tf checkpoint, the TF Hub module or an ELMoForManyLangs model to options.json + weights.hdf5",
    ),
}


def build_parser(prog=PROG):
    """The top-level parser: lists the subcommands; each subcommand's flags are parsed by its own module."""
    parser = ArgumentParser(
        prog=prog,
        description="ELMo tools: embed text, pretrain and evaluate biLMs, export, serve, train and run NER taggers.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"examples:\n"
        f"  {prog} embed --options options.json --weights weights.hdf5 --input sentences.txt --output out.hdf5\n"
        f"  {prog} embed --help      # all options of embed\n"
        f"  {prog} dump-token-embeddings --options options.json --weights weights.hdf5 --vocab vocab.txt "
        "--output token_embeddings.hdf5",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")
    for name, (_module, _function, help_line) in COMMANDS.items():
        sub.add_parser(name, help=help_line, add_help=False)
    return parser


def command_main(name):
    """The `main(argv, prog)` of subcommand `name` (its module imported now)."""
    module, function, _help = COMMANDS[name]
    return getattr(importlib.import_module(module), function)


def dispatch(argv, prog=PROG):
    """Runs `prog COMMAND ARGS...`: the top-level parser answers --help and an unknown or missing command; the
    command's own parser reads ARGS."""
    if not argv or argv[0] not in COMMANDS:
        build_parser(prog).parse_args(argv)  # --help, or a one-line error naming the command (exit 2)
        return 2  # not reached: parse_args exits on anything that is not a command
    return command_main(argv[0])(argv[1:], prog=f"{prog} {argv[0]}")


def main(argv=None, prog=PROG):
    """The console script `elmo-tf` (and `python -m elmo_tf`): returns the exit status (the console script's wrapper
    passes it to `sys.exit`), under the `elmo_tf.cli` contract with the subcommand in the error lines."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before a subcommand imports TensorFlow
    argv = sys.argv[1:] if argv is None else list(argv)
    name = f"{prog} {argv[0]}" if argv and argv[0] in COMMANDS else prog
    return run(lambda args: dispatch(args, prog), argv, prog=name)
