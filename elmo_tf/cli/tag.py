"""Tags text with a trained NER head (a train_ner.py or tune_ner.py output directory).

Input: one sentence per line, UTF-8, tokens separated by ASCII whitespace (stdin, or --input FILE); an empty line is
an empty sentence. Output (stdout, one result per input line, in order):
  conll (default): `token<TAB>tag` lines, a blank line after each sentence (an empty sentence: the blank line only);
  json: one JSON object per line: {"tokens": [...], "tags": [...],
        "spans": [{"type": "PER", "start": 0, "end": 2, "text": "John Smith"}]}   (end exclusive).
Tags are in the training files' scheme (IOB1 for CoNLL-2003, IOB2 for WNUT-17; encoder.json's source_scheme).

The ELMo features must come from the biLM the head was trained on. By default tag.py uses what training used
(config.json in the model directory): the same weights in process, or the same model server; --elmo or
--elmo-server override it. A model trained with --no-elmo needs neither.
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
import os
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
        "beside it (default: what config.json says training used)",
    )
    source.add_argument("--elmo-server", help="HOST:PORT of a model server with the ELMo export")
    p.add_argument("--model-name", default=None, help="model name on the server (default: training's, else elmo)")
    ner_cli.add_server_flags(p)
    p.add_argument("--batch-size", type=size_int("--batch-size"), default=32, help="sentences per model call (32)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or log lines on stderr")
    return p


def resolve_source(args, model_dir, needs_elmo):
    """The feature source for the tagger: the flags, else config.json's record of training; None without ELMo."""
    from elmo_tf.ner.features import FeatureSourceError, changed_source, open_feature_source
    from elmo_tf.ner.tagging import recorded_source

    given = args.elmo or args.elmo_server
    if not needs_elmo:
        if given:
            raise UsageError(
                f"--{'elmo' if args.elmo else 'elmo-server'}: the model in {model_dir!r} was trained "
                f"without ELMo features (--no-elmo); drop the flag"
            )
        return None
    try:
        recorded = recorded_source(model_dir)
    except ValueError as e:
        raise DataError(f"--model: {e}") from None
    model_name = args.model_name or recorded.get("model_name") or "elmo"
    if args.elmo_server or (not given and recorded.get("kind") == "server"):
        flag, kwargs = (
            "--elmo-server",
            dict(
                elmo_server=args.elmo_server or recorded["address"],
                model_name=model_name,
                max_request_tokens=args.server_max_tokens,
            ),
        )
    elif args.elmo:
        flag, kwargs = "--elmo", dict(elmo=args.elmo)
    elif recorded.get("kind") == "in_process":
        flag, kwargs = "--elmo", dict(options=recorded.get("options"), weights=recorded.get("weights"))
        for path in kwargs.values():
            if not path or not os.path.isfile(path):
                raise UsageError(
                    f"--elmo: the biLM recorded in config.json is gone ({path!r}); give --elmo "
                    f"DIR_OR_HDF5 or --elmo-server HOST:PORT"
                )
    else:
        raise UsageError(
            f"--elmo: the model in {model_dir!r} needs ELMo features and its config.json does not say "
            f"where training got them; give --elmo DIR_OR_HDF5 or --elmo-server HOST:PORT"
        )
    origin = "" if given else " (the source recorded in config.json; override it with --elmo or --elmo-server)"
    try:
        source, _ = open_feature_source(batch_size=args.batch_size, **kwargs)
    except FeatureSourceError as e:
        raise DataError(f"{flag}: {e}{origin}") from None
    changed = changed_source(recorded, source)  # the same path or address, but another biLM than training's
    if changed and not given:
        raise DataError(f"{flag}: {changed}{origin}")
    if changed:
        logger.warning("%s: %s; tagging with it as asked", flag, changed)
    return source


def main(argv=None, prog=PROG):
    args = build_parser(prog).parse_args(argv)
    from elmo_tf.ner.features import SentenceTooLongError
    from elmo_tf.ner.tagging import (
        TextError,
        check_model_dir,
        format_conll,
        format_json,
        load_tagger,
        read_lines,
        tag_sentences,
    )

    try:
        check_model_dir(args.model)
    except ValueError as e:
        raise UsageError(f"--model: {e}") from None
    setup_logging(quiet=args.quiet)
    from tqdm import tqdm

    from elmo_tf.io.atomic import stdout_write_error

    try:
        if args.input is None:
            sentences = read_lines(sys.stdin.buffer)
        else:
            with open(args.input, "rb") as f:
                sentences = read_lines(f, args.input)
    except TextError as e:
        raise DataError(f"--input: {e}") from None
    try:
        model, encoder, dim = load_tagger(args.model)
    except ValueError as e:
        raise DataError(f"--model: {e}") from None
    source = resolve_source(args, args.model, model.num_elmo_layers > 0)
    if source is not None and (source.num_layers, source.dim) != (model.num_elmo_layers, dim):
        flag = "--elmo-server" if args.elmo_server else "--elmo"
        raise DataError(
            f"{flag}: the biLM gives {source.num_layers} layers of width {source.dim}, the model was "
            f"trained on {model.num_elmo_layers} layers of width {dim}"
        )

    scheme = encoder.source_scheme
    logger.info(
        "tagging %d sentences (%s model, tags in %s)",
        len(sentences),
        "ELMo" if source is not None else "no-ELMo",
        scheme,
    )
    out = sys.stdout
    with tqdm(
        total=len(sentences),
        unit="sent",
        file=sys.stderr,
        disable=args.quiet or len(sentences) < PROGRESS_MIN_SENTENCES,
    ) as progress:
        for start in range(0, len(sentences), CHUNK_SENTENCES):
            chunk = sentences[start : start + CHUNK_SENTENCES]
            try:
                tags = tag_sentences(model, encoder, chunk, source, args.batch_size)
            except SentenceTooLongError as e:
                name = args.input or "<stdin>"
                raise DataError(f"--input: {name}:{start + e.index + 1}: {e}") from None
            except Exception as e:  # a server that went away mid-way, etc.
                raise DataError(f"tagging sentences {start + 1}-{start + len(chunk)} failed: {one_line(e)}") from None
            try:
                for tokens, sentence_tags in zip(chunk, tags):
                    out.write(
                        format_conll(tokens, sentence_tags)
                        if args.format == "conll"
                        else format_json(tokens, sentence_tags, scheme)
                    )
                out.flush()
            except BrokenPipeError:  # `| head`: elmo_tf.cli.run ends quietly
                raise
            except OSError as e:  # `> file` on a full disk
                raise DataError(f"stdout: {stdout_write_error(e)}") from None
            progress.update(len(chunk))
    return 0
