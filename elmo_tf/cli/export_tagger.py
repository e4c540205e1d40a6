"""Exports the NER tagger with its frozen ELMo as one SavedModel: sentences -> tags and entity spans.

A thin command line over `elmo_tf.ner.export.export_tagger` (signatures `tag`/`serving_default` and `featurize`;
see that module). Versioned like the ELMo export (`<base>/<version>/`, never overwritten, written atomically).
Exit status: 0 done, 2 bad command line, 1 bad model files or a failed export.

The biLM computes in the precision training's features were computed in (config.json), unless --precision says
otherwise; the version's assets.extra/elmo_tf.json records it.

examples:
  python export/export_tagger.py --ner runs/ner --elmo runs/small --output models/tagger
  python export/export_tagger.py --ner runs/ner_base --output models/tagger_base    # a --no-elmo tagger
  python export/export_tagger.py --ner runs/ner --output models/tagger_bf16 --precision bfloat16
"""

import argparse
import logging
import os

from elmo_tf.cli import ArgumentParser, DataError, UsageError, existing_dir, setup_logging
from elmo_tf.cli.export import add_export_flags, check_export_flags
from elmo_tf.cli.precision import add_precision_flag, precision_text, resolved_precision

PROG = "export_tagger.py"

logger = logging.getLogger("export_tagger")


def build_parser(prog=PROG):
    parser = ArgumentParser(
        prog=prog,
        description=__doc__.split("\n")[0],
        epilog=__doc__.split("\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--ner",
        required=True,
        type=existing_dir("--ner"),
        help="train_ner.py output dir (model.keras, encoder.json, config.json)",
    )
    parser.add_argument(
        "--elmo",
        default=None,
        help="the biLM the tagger was trained on: dir or weights.hdf5, or a released model's name or URL (default: "
        "what the NER dir's config.json names)",
    )
    add_export_flags(parser, output_help="base dir, e.g. models/tagger")
    add_precision_flag(
        parser,
        default=None,
        what=" of the biLM in the export (default: what training's features were computed in, from config.json; "
        "float32 for a tagger trained before precisions)",
    )
    return parser


def elmo_for(args, head):
    """The ELMo model the tagger needs (None without ELMo): --elmo, else the in-process source training recorded."""
    from elmo_tf.models import load_elmo
    from elmo_tf.ner.features import elmo_paths
    from elmo_tf.ner.tagging import recorded_source

    if not head.num_elmo_layers:
        if args.precision is not None:
            raise UsageError("--precision: the tagger was trained without ELMo features; drop the flag")
        return None
    try:
        recorded = recorded_source(args.ner)
    except ValueError as e:
        raise DataError(f"--ner: {e}") from None
    trained = recorded.get("precision") if recorded.get("kind") == "in_process" else None
    precision = resolved_precision(args.precision or trained or "float32")
    logger.info("the biLM computes in %s", precision_text(precision, args.precision))
    if args.elmo:
        options, weights = elmo_paths(args.elmo)
        flag = "--elmo"
    else:
        if recorded.get("kind") != "in_process":
            raise UsageError("--elmo: the tagger was trained on served features; name the biLM files (--elmo DIR)")
        options, weights, flag = recorded["options"], recorded["weights"], "--ner (config.json's elmo_source)"
    for path in (options, weights):
        if not os.path.isfile(path):
            raise UsageError(f"{flag}: no such file: {path!r}")
    try:
        return load_elmo(options, weights, precision=precision)
    except (ValueError, OSError) as e:
        raise DataError(f"{flag}: cannot load the biLM: {e}") from None


def main(argv=None, prog=PROG):
    args = build_parser(prog).parse_args(argv)
    from elmo_tf.cli.models import resolve_elmo_flag
    from elmo_tf.ner.tagging import check_model_dir, load_tagger

    resolve_elmo_flag(args)

    try:
        check_model_dir(args.ner)
    except ValueError as e:
        raise UsageError(f"--ner: {e}") from None
    check_export_flags(args)
    setup_logging()
    from elmo_tf.ner.export import TAG_SIGNATURE, export_tagger

    try:
        head, encoder, _ = load_tagger(args.ner)
    except ValueError as e:
        raise DataError(f"--ner: {e}") from None
    elmo = elmo_for(args, head)
    try:
        path = export_tagger(
            head,
            encoder,
            args.output,
            elmo=elmo,
            version=args.version,
            tokenizer=args.tokenizer,
            max_tokens=args.max_tokens,
        )
    except FileExistsError as e:
        raise UsageError(f"--version: {e}") from None
    except (RuntimeError, OSError) as e:
        raise DataError(f"--output: export failed: {e}") from None
    logger.info("wrote %s (signature %r and serving_default)", path, TAG_SIGNATURE)
    print(path)
    return 0
