"""`elmo-tf convert`: another ELMo's files -> options.json + weights.hdf5 (+ softmax.hdf5, ...) (`elmo_tf.convert`).

Errors follow `elmo_tf.cli`: a bad flag, a missing source dir or an output dir that cannot be used exits 2 before
anything is read; a source that cannot be converted (a missing file, an empty checkpoint, shapes that disagree)
exits 1 with one line naming the file and what was expected; in both cases nothing is written.
"""

import argparse
import logging
import os

from elmo_tf.cli import ArgumentParser, UsageError, existing_dir, existing_file, setup_logging

PROG = "elmo-tf convert"

# the names of elmo_tf.convert.SOURCES (that module is light, but the parser should not depend on it to build)
SOURCES = ("elmoformanylangs", "bilm-tf-checkpoint", "tf-hub")

EPILOG = """examples:
  elmo-tf convert --from bilm-tf-checkpoint runs/my_bilm --output my_elmo/
  elmo-tf convert --from tf-hub elmo_3/ --output hub_elmo/        # the unpacked tfhub.dev/google/elmo/3 tarball
  elmo-tf convert --from elmoformanylangs 144/ --output efml_elmo/
  elmo-tf embed --options my_elmo/options.json --weights my_elmo/weights.hdf5 --input s.txt --output out.hdf5

sources:
  bilm-tf-checkpoint  bilm-tf's training dir: model.ckpt-<step>.index/.data (the one `checkpoint` names, else the
                      largest step; the dir may have been moved) and options.json (or --options). Writes what
                      bilm-tf's dump_weights writes, bit for bit, and softmax.hdf5 (softmax/W, softmax/b).
  tf-hub              the google/elmo module dir (TF1 Hub format: tfhub_module.pb, variables/). Writes
                      scalar_mix.json too: the module's learned layer weights and scale, as ScalarMix arguments.
  elmoformanylangs    an ELMoForManyLangs model dir (config.json, char.dic, word.dic, *.pkl).

output: a new (or empty) directory, written under a hidden temporary name beside it and renamed at the end: on
any error nothing is left. It works wherever --options/--weights or a model dir are taken (embed, export, serve,
pretrain --init-from, train-ner --elmo).
"""


def build_parser(prog=PROG):
    p = ArgumentParser(
        prog=prog,
        description="Convert an ELMo of another format (bilm-tf checkpoint, TF Hub module, ELMoForManyLangs) to "
        "options.json + weights.hdf5.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--from", dest="source", required=True, choices=SOURCES, help="the source format")
    p.add_argument("src_dir", metavar="DIR", type=existing_dir("DIR"), help="the source directory")
    p.add_argument("--output", required=True, metavar="OUTDIR", help="the directory to write (new or empty)")
    p.add_argument(
        "--options",
        type=existing_file("--options"),
        default=None,
        metavar="FILE",
        help="options.json to use (bilm-tf-checkpoint: instead of DIR/options.json; tf-hub: instead of the "
        "settings derived from the variables, checked against them)",
    )
    return p


def check_output(src_dir, out_dir):
    """Raises `UsageError` naming --output unless the conversion can be written there."""
    if os.path.exists(out_dir):
        if os.path.samefile(out_dir, src_dir):
            raise UsageError(f"--output: {out_dir!r} is the source DIR; give a new directory")
        if not os.path.isdir(out_dir):
            raise UsageError(f"--output: exists and is not a directory: {out_dir!r}")
        if os.listdir(out_dir):
            raise UsageError(f"--output: {out_dir!r} exists and is not empty; give a new directory")
    ancestor = os.path.dirname(os.path.abspath(out_dir))
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor) or not os.access(ancestor, os.W_OK):
        raise UsageError(f"--output: cannot create {out_dir!r} ({ancestor!r} is not a writable directory)")


def main(argv=None, prog=PROG):
    """`convert`; returns the exit status (run it with `elmo_tf.cli.run`)."""
    args = build_parser(prog).parse_args(argv)
    check_output(args.src_dir, args.output)
    from elmo_tf.convert import SOURCES as REGISTRY
    from elmo_tf.convert import UnavailableSourceError, convert, source_module

    if args.options is not None and "options" not in REGISTRY[args.source][2]:
        raise UsageError(f"--options: not used by --from {args.source}")
    try:
        source_module(args.source)
    except UnavailableSourceError as e:
        raise UsageError(f"--from: {e}") from None
    setup_logging()
    written = convert(args.source, args.src_dir, args.output, options=args.options)
    logging.getLogger("elmo_tf").info("wrote %s", ", ".join(written))
    return 0
