"""Tags text with a trained NER head (a train_ner.py or tune_ner.py output directory).

Input: one sentence per line, tokens separated by whitespace (stdin, or --input FILE); an empty line is an
empty sentence. Output (stdout, one result per input line, in order):
  conll (default): `token<TAB>tag` lines, a blank line after each sentence;
  json: one JSON object per line: {"tokens": [...], "tags": [...],
        "spans": [{"type": "PER", "start": 0, "end": 2, "text": "John Smith"}]}   (end exclusive).
Tags are in the training files' scheme (IOB1 for CoNLL-2003, IOB2 for WNUT-17; encoder.json's source_scheme).

The ELMo features must come from the biLM the head was trained on. By default tag.py uses what training used
(config.json in the model directory): the same weights in process, or the same model server; --elmo or
--elmo-server override it. A model trained with --no-elmo needs neither.

examples:
  echo "EU rejects German call to boycott British lamb ." | python training/tag.py --model runs/ner
  python training/tag.py --model runs/ner --input sentences.txt --format json > tagged.jsonl
  python training/tag.py --model runs/ner --elmo runs/pretrain < sentences.txt        # ELMo in this process
  python training/tag.py --model runs/ner --elmo-server localhost:8500 < sentences.txt  # ELMo over gRPC
  python training/tag.py --model runs/ner_base < sentences.txt                         # a --no-elmo model
"""

import argparse
import json
import logging
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHUNK_SENTENCES = 1024  # sentences featurized and tagged at a time (output is written after each chunk)
PROGRESS_MIN_SENTENCES = 256  # a progress bar on stderr from this many sentences on

logger = logging.getLogger("tag")


class OneLineParser(argparse.ArgumentParser):
    """argparse with a one-line error (`prog: error: --flag: ...`) instead of usage + error."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser():
    p = OneLineParser(
        prog="tag.py",
        description=__doc__.split("\n")[0],
        epilog=__doc__.split("\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", required=True, help="NER directory: model.keras, encoder.json (config.json)")
    p.add_argument("--input", default=None, help="text file, one sentence per line (default: stdin)")
    p.add_argument("--format", default="conll", choices=("conll", "json"), help="output format (conll)")
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "--elmo",
        help="biLM in process: pretraining output dir, or weights.hdf5 with options.json "
        "beside it (default: what config.json says training used)",
    )
    source.add_argument("--elmo-server", help="HOST:PORT of a model server with the ELMo export")
    p.add_argument("--model-name", default=None, help="model name on the server (default: training's, else elmo)")
    p.add_argument("--batch-size", type=int, default=32, help="sentences per model call (32)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or log lines on stderr")
    return p


# ------------------------------------------------------------------------------------------------ features


def elmo_paths(path):
    """(options.json, weights.hdf5) of an --elmo argument: a directory holding both, or a .hdf5 file with
    options.json beside it (as train_ner.py reads it)."""
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    weights = path if path.endswith(".hdf5") else os.path.join(folder, "weights.hdf5")
    return os.path.join(folder, "options.json"), weights


def open_feature_source(elmo=None, elmo_server=None, model_name="elmo", options=None, weights=None, batch_size=32):
    """An `InProcessFeatures` (`elmo`, or `options` + `weights`) or `ServedFeatures` (`elmo_server`), and a
    description of it in train_ner.py's config.json layout. Raises ValueError with a one-line reason."""
    if elmo_server:
        try:
            from serving.client import ElmoClient
        except ImportError as e:
            raise ValueError(f"the gRPC client (serving/client.py) cannot be imported: {e}") from None
        from elmo_tf.ner import ServedFeatures

        try:
            source = ServedFeatures(ElmoClient(elmo_server, model_name=model_name), batch_size=batch_size)
        except Exception as e:  # the client's ServingError carries the gRPC status
            raise ValueError(
                f"cannot get features from {elmo_server!r} (model {model_name!r}): {' '.join(str(e).split())}"
            ) from None
        return source, {"kind": "server", "address": elmo_server, "model_name": model_name}
    if elmo:
        options, weights = elmo_paths(elmo)
    for what, path in (("options", options), ("weights", weights)):
        if not path or not os.path.isfile(path):
            raise ValueError(f"no {what} file at {path!r}")
    from elmo_tf.io import load_elmo
    from elmo_tf.ner import InProcessFeatures

    try:
        source = InProcessFeatures(load_elmo(options, weights), batch_size=batch_size)
    except (ValueError, OSError, KeyError) as e:
        raise ValueError(f"cannot load the biLM from {options!r} and {weights!r}: {e}") from None
    return source, {"kind": "in_process", "options": os.path.abspath(options), "weights": os.path.abspath(weights)}


# ------------------------------------------------------------------------------------------------ model


def load_tagger(model_dir):
    """(NERTagger with its trained weights, Encoder, activation dim or None) from a train_ner.py directory."""
    import keras

    import elmo_tf.models.ner_tagger  # noqa: F401  (registers NERTagger, CRF for deserialization)
    from elmo_tf.ner import Encoder

    model = keras.saving.load_model(os.path.join(model_dir, "model.keras"), compile=False)
    dim = model.get_build_config()["activation_dim"]
    return model, Encoder.load(os.path.join(model_dir, "encoder.json")), dim


# ------------------------------------------------------------------------------------------------ tagging


def read_sentences(stream):
    """One whitespace-tokenized sentence per line (an empty line: an empty sentence)."""
    return [line.split() for line in stream]


def tag_sentences(model, encoder, sentences, source=None, batch_size=32):
    """Tag strings (the encoder's source scheme) for each token list; `source` gives the ELMo features."""
    from elmo_tf.io.conll import Sentence
    from elmo_tf.ner import NERBatches, predict_tags

    items = [Sentence(list(tokens), ["O"] * len(tokens), 0) for tokens in sentences]
    features = source([s.tokens for s in items]) if model.num_elmo_layers else None
    batches = NERBatches(
        items,
        encoder,
        features,
        batch_size=batch_size,
        shuffle=False,
        use_words=model.word_vocab_size > 0,
        use_chars=bool(model.char_filters),
        with_tags=False,
    )
    return predict_tags(model, batches)


def entity_spans(tokens, tags, scheme):
    from elmo_tf.preprocessing.tags import spans

    return [
        {"type": kind, "start": start, "end": end, "text": " ".join(tokens[start:end])}
        for kind, start, end in spans(tags, scheme)
    ]


def format_conll(tokens, tags):
    return "".join(f"{token}\t{tag}\n" for token, tag in zip(tokens, tags)) + "\n"


def format_json(tokens, tags, scheme):
    return (
        json.dumps({"tokens": tokens, "tags": tags, "spans": entity_spans(tokens, tags, scheme)}, ensure_ascii=False)
        + "\n"
    )


# ------------------------------------------------------------------------------------------------ CLI


def resolve_source(args, parser, model_dir, needs_elmo):
    """The feature source for the tagger: the flags, else config.json's record of training; None without ELMo."""
    given = args.elmo or args.elmo_server
    if not needs_elmo:
        if given:
            parser.error(
                f"--{'elmo' if args.elmo else 'elmo-server'}: the model in {model_dir!r} was trained "
                f"without ELMo features (--no-elmo); drop the flag"
            )
        return None
    recorded = {}
    config_path = os.path.join(model_dir, "config.json")
    if os.path.isfile(config_path):
        with open(config_path, encoding="utf-8") as f:
            recorded = json.load(f).get("elmo_source") or {}
    model_name = args.model_name or recorded.get("model_name") or "elmo"
    if args.elmo_server or (not given and recorded.get("kind") == "server"):
        flag, address = "--elmo-server", args.elmo_server or recorded["address"]
        kwargs = dict(elmo_server=address, model_name=model_name)
    elif args.elmo:
        flag, kwargs = "--elmo", dict(elmo=args.elmo)
    elif recorded.get("kind") == "in_process":
        flag, kwargs = "--elmo", dict(options=recorded.get("options"), weights=recorded.get("weights"))
    else:
        parser.error(
            f"--elmo: the model in {model_dir!r} needs ELMo features and its config.json does not say "
            f"where training got them; give --elmo DIR_OR_HDF5 or --elmo-server HOST:PORT"
        )
    try:
        source, _ = open_feature_source(batch_size=args.batch_size, **kwargs)
    except ValueError as e:
        origin = "" if given else f" (the source recorded in {config_path!r}; override it with --elmo or --elmo-server)"
        parser.error(f"{flag}: {e}{origin}")
    return source


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr
    )
    for name in ("model.keras", "encoder.json"):
        if not os.path.isfile(os.path.join(args.model, name)):
            parser.error(f"--model: no {name} in {args.model!r} (expected a train_ner.py output directory)")
    if args.input is not None and not os.path.isfile(args.input):
        parser.error(f"--input: no such file: {args.input!r}")
    if args.batch_size < 1:
        parser.error(f"--batch-size: must be >= 1, got {args.batch_size}")
    try:
        if args.input is None:
            sentences = read_sentences(sys.stdin)
        else:
            with open(args.input, encoding="utf-8") as f:
                sentences = read_sentences(f)
    except UnicodeDecodeError as e:
        parser.error(f"--input: not UTF-8 text: {e}")

    try:
        model, encoder, dim = load_tagger(args.model)
    except Exception as e:  # a corrupt or foreign .keras file: say which directory, in one line
        parser.error(f"--model: cannot load the tagger from {args.model!r}: {' '.join(str(e).split())}")
    source = resolve_source(args, parser, args.model, model.num_elmo_layers > 0)
    if source is not None and (source.num_layers, source.dim) != (model.num_elmo_layers, dim):
        flag = "--elmo-server" if args.elmo_server else "--elmo"
        parser.error(
            f"{flag}: the biLM gives {source.num_layers} layers of width {source.dim}, the model was trained "
            f"on {model.num_elmo_layers} layers of width {dim}"
        )

    from tqdm import tqdm

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
            except Exception as e:  # a server that went away mid-way, etc.
                logger.error("tagging sentences %d-%d failed: %s", start + 1, start + len(chunk), e)
                return 1
            for tokens, sentence_tags in zip(chunk, tags):
                out.write(
                    format_conll(tokens, sentence_tags)
                    if args.format == "conll"
                    else format_json(tokens, sentence_tags, scheme)
                )
            out.flush()
            progress.update(len(chunk))
    return 0


if __name__ == "__main__":
    sys.exit(main())
