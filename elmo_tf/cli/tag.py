"""Tags text with a trained NER head (a train_ner.py or tune_ner.py output directory).

Input: one sentence per line, UTF-8, tokens separated by ASCII whitespace (stdin, or --input FILE); an empty line is
an empty sentence. Output (stdout, one result per input line, in order):
  conll (default): `token<TAB>tag` lines, a blank line after each sentence (an empty sentence: the blank line only);
  json: one JSON object per line: {"tokens": [...], "tags": [...],
        "spans": [{"type": "PER", "start": 0, "end": 2, "text": "John Smith"}]}   (end exclusive).
Tags are in the training files' scheme (IOB1 for CoNLL-2003, IOB2 for WNUT-17; encoder.json's source_scheme).

The ELMo features must come from the biLM the head was trained on. By default tag.py uses what training used
(config.json in the model directory): the same weights in process, or the same model server; --elmo or
--elmo-server override it. A model trained with --no-elmo needs neither. A biLM in this process computes in the
precision training's features were computed in (config.json), unless --precision says otherwise.
Exit status: 0 done, 2 bad command line, 1 bad input text (the message names the line) or a failed model/server.

examples:
  echo "EU rejects German call to boycott British lamb ." | python training/tag.py --model runs/ner
  python training/tag.py --model runs/ner --input sentences.txt --format json > tagged.jsonl
  python training/tag.py --model runs/ner --elmo runs/pretrain < sentences.txt        # ELMo in this process
  python training/tag.py --model runs/ner --elmo-server localhost:8500 < sentences.txt  # ELMo over gRPC
  python training/tag.py --model runs/ner_base < sentences.txt                         # a --no-elmo model
"""

import argparse
import logging
import sys

from elmo_tf.cli import (
    ArgumentParser,
    DataError,
    UsageError,
    existing_dir,
    existing_file,
    one_line,
    setup_logging,
    size_int,
)
from elmo_tf.cli import ner as ner_cli
from elmo_tf.cli.precision import add_precision_flag, precision_text, resolved_precision

PROG = "tag.py"

CHUNK_SENTENCES = 1024  # sentences featurized and tagged at a time (output is written after each chunk)
PROGRESS_MIN_SENTENCES = 256  # a progress bar on stderr from this many sentences on

logger = logging.getLogger("tag")


def build_parser(prog=PROG):
    p = ArgumentParser(
        prog=prog,
        description=__doc__.split("\n")[0],
        epilog=__doc__.split("\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model",
        required=True,
        type=existing_dir("--model"),
        help="NER directory: model.keras, encoder.json (config.json)",
    )
    p.add_argument(
        "--input", default=None, type=existing_file("--input"), help="text file, one sentence per line (default: stdin)"
    )
    p.add_argument("--format", default="conll", choices=("conll", "json"), help="output format (conll)")
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "--elmo",
        help="biLM in process: pretraining output dir, or weights.hdf5 with options.json "
        "beside it, or a released model's name or URL (default: what config.json says training used)",
    )
    source.add_argument("--elmo-server", help="HOST:PORT of a model server with the ELMo export")
    add_precision_flag(
        p,
        default=None,
        what=" of a biLM in this process (default: what training's features were computed in, from config.json; "
        "float32 for a tagger trained before precisions)",
    )
    p.add_argument("--model-name", default=None, help="model name on the server (default: training's, else elmo)")
    ner_cli.add_server_flags(p)
    p.add_argument("--batch-size", type=size_int("--batch-size"), default=32, help="sentences per model call (32)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or log lines on stderr")
    return p


def resolve_source(args, model_dir, needs_elmo):
    """(the feature source for the tagger: the flags, else config.json's record of training; the flag it answers
    to), or (None, None) without ELMo."""
    from elmo_tf.ner.features import FeatureSourceError, changed_precision, changed_source, open_feature_source
    from elmo_tf.ner.tagging import RecordedSourceError, recorded_source, source_arguments

    given = args.elmo or args.elmo_server
    if not needs_elmo:
        if given:
            raise UsageError(
                f"--{'elmo' if args.elmo else 'elmo-server'}: the model in {model_dir!r} was trained "
                f"without ELMo features (--no-elmo); drop the flag"
            )
        if args.precision is not None:
            raise UsageError(
                f"--precision: the model in {model_dir!r} was trained without ELMo features; drop the flag"
            )
        return None, None
    try:
        recorded = recorded_source(model_dir)
    except ValueError as e:
        raise DataError(f"--model: {e}") from None
    try:
        kwargs = source_arguments(
            model_dir, recorded, args.elmo, args.elmo_server, args.model_name, args.server_max_tokens
        )
    except RecordedSourceError as e:
        raise UsageError(f"--elmo: {e}; give --elmo DIR_OR_HDF5 or --elmo-server HOST:PORT") from None
    flag = "--elmo-server" if "elmo_server" in kwargs else "--elmo"
    origin = "" if given else " (the source recorded in config.json; override it with --elmo or --elmo-server)"
    kwargs["precision"] = _precision(args, recorded, served="elmo_server" in kwargs)
    try:
        credentials = ner_cli.server_credentials(args, kwargs.get("elmo_server"))
        source, _ = open_feature_source(batch_size=args.batch_size, credentials=credentials, **kwargs)
    except FeatureSourceError as e:
        raise DataError(f"{flag}: {e}{origin}") from None
    if changed_precision(recorded, source):  # only when asked for: the default is training's
        logger.warning("--precision: %s; tagging with them as asked", changed_precision(recorded, source))
    changed = changed_source(recorded, source)  # the same path or address, but another biLM than training's
    if changed and not given:
        raise DataError(f"{flag}: {changed}{origin}")
    if changed:
        logger.warning("%s: %s; tagging with it as asked", flag, changed)
    return source, flag


def _precision(args, recorded, served):
    """The precision of a biLM in this process: --precision, else the one training's features were computed in
    (config.json's `elmo_source`; float32 without one), decided and said in a log line; None for a served source
    (UsageError when --precision is given for one)."""
    if served:
        if args.precision is not None:
            raise UsageError(
                "--precision: only for a biLM in this process (--elmo); the server computes in the precision of its "
                "export (elmo-tf export --precision)"
            )
        return None
    trained = recorded.get("precision") if recorded.get("kind") == "in_process" else None
    return resolved_precision(args.precision or trained or "float32")


def read_sentences(args):
    """The token lists of --input (or stdin); DataError naming the line that is not UTF-8."""
    from elmo_tf.ner.tagging import TextError, read_lines

    try:
        if args.input is None:
            return read_lines(sys.stdin.buffer)
        with open(args.input, "rb") as f:
            return read_lines(f, args.input)
    except TextError as e:
        raise DataError(f"--input: {e}") from None


def load_pipeline(args):
    """The `NERPipeline` of --model with its feature source (DataError: a model or a biLM that does not fit)."""
    from elmo_tf.ner.pipeline import NERPipeline, SourceMismatchError
    from elmo_tf.ner.tagging import load_tagger

    try:
        model, encoder, _ = load_tagger(args.model)
    except ValueError as e:
        raise DataError(f"--model: {e}") from None
    source, flag = resolve_source(args, args.model, model.num_elmo_layers > 0)
    try:
        return NERPipeline(model, encoder, source)
    except SourceMismatchError as e:
        raise DataError(f"{flag}: {e}") from None


def write_chunk(out, chunk, tags, output_format, scheme):
    """One chunk's results on `out` (stdout), flushed; DataError naming stdout when it cannot be written."""
    from elmo_tf.io.atomic import stdout_write_error
    from elmo_tf.ner.tagging import format_conll, format_json

    try:
        for tokens, sentence_tags in zip(chunk, tags):
            if output_format == "conll":
                out.write(format_conll(tokens, sentence_tags))
            else:
                out.write(format_json(tokens, sentence_tags, scheme))
        out.flush()
    except BrokenPipeError:  # `| head`: elmo_tf.cli.run ends quietly
        raise
    except OSError as e:  # `> file` on a full disk
        raise DataError(f"stdout: {stdout_write_error(e)}") from None


def main(argv=None, prog=PROG):
    args = build_parser(prog).parse_args(argv)
    from elmo_tf.cli.models import resolve_elmo_flag
    from elmo_tf.ner.tagging import check_model_dir

    resolve_elmo_flag(args, quiet=args.quiet)

    try:
        check_model_dir(args.model)
    except ValueError as e:
        raise UsageError(f"--model: {e}") from None
    setup_logging(quiet=args.quiet)
    from tqdm import tqdm

    from elmo_tf.ner.features import SentenceTooLongError

    sentences = read_sentences(args)
    pipeline = load_pipeline(args)
    scheme = pipeline.encoder.source_scheme
    precision = getattr(pipeline.source, "precision", None)
    logger.info(
        "tagging %d sentences (%s model, tags in %s%s)",
        len(sentences),
        "ELMo" if pipeline.uses_elmo else "no-ELMo",
        scheme,
        f", ELMo features in {precision_text(precision, args.precision)}" if precision else "",
    )
    with tqdm(
        total=len(sentences),
        unit="sent",
        file=sys.stderr,
        disable=args.quiet or len(sentences) < PROGRESS_MIN_SENTENCES,
    ) as progress:
        for start in range(0, len(sentences), CHUNK_SENTENCES):
            chunk = sentences[start : start + CHUNK_SENTENCES]
            try:
                tags = pipeline.tag(chunk, args.batch_size)
            except SentenceTooLongError as e:
                name = args.input or "<stdin>"
                raise DataError(f"--input: {name}:{start + e.index + 1}: {e}") from None
            except Exception as e:  # a server that went away mid-way, etc.
                raise DataError(f"tagging sentences {start + 1}-{start + len(chunk)} failed: {one_line(e)}") from None
            write_chunk(sys.stdout, chunk, tags, args.format, scheme)
            progress.update(len(chunk))
    return 0
