"""Exports the NER tagger with its frozen ELMo as one SavedModel: sentences -> tags and entity spans.

Signature `tag` (also `serving_default`): input `sentences` tf.string `(batch,)`, tokenized in the graph
like the ELMo export. Outputs:
    `tokens` tf.string `(batch, T)` ("" padding), `sequence_len` int32 `(batch,)`,
    `tags` tf.string `(batch, T)`: the CRF's tags (in the tagger's --crf-scheme, BIOES by default; "" padding),
    `num_spans` int32 `(batch,)`, `span_start` / `span_end` int32 `(batch, S)` (token offsets, end exclusive;
    -1 padding), `span_type` tf.string `(batch, S)` ("" padding).
The tagger's own word features look words up lowercased (`tf.strings.lower`, UTF-8); the vocabulary and
labels are stored in the graph. Versioned like the ELMo export (`<base>/<version>/`, never overwritten).

examples:
  python export/export_tagger.py --ner runs/ner --elmo runs/small --output models/tagger
  python export/export_tagger.py --ner runs/ner_base --output models/tagger_base    # a --no-elmo tagger
"""

import argparse
import json
import logging
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from elmo_tf.preprocessing.chars import tokens_to_char_ids  # noqa: E402
from export.export_savedmodel import make_tokenizer, publish_version  # noqa: E402

logger = logging.getLogger("export_tagger")
SIGNATURE = "tag"


def _label_parts(labels):
    prefixes = [label.split("-", 1)[0] if label != "O" else "O" for label in labels]
    kinds = [label.split("-", 1)[1] if label != "O" else "" for label in labels]
    return prefixes, kinds


def spans_from_tags(tag_ids, mask, labels):
    """Entity spans of valid IOB2/BIOES tag ids, in the graph: (num, start, end, type), padded -1 / ""."""
    prefixes, kinds = _label_parts(labels)
    prefix = tf.gather(tf.constant(prefixes), tag_ids)
    kind = tf.gather(tf.constant(kinds), tag_ids)
    inside = mask & tf.not_equal(prefix, "O")
    starts = mask & ((prefix == "B") | (prefix == "S"))
    next_prefix = tf.concat([prefix[:, 1:], tf.fill([tf.shape(prefix)[0], 1], "O")], axis=1)
    next_kind = tf.concat([kind[:, 1:], tf.fill([tf.shape(kind)[0], 1], "")], axis=1)
    next_mask = tf.concat([mask[:, 1:], tf.zeros_like(mask[:, :1])], axis=1)
    continues = (
        next_mask
        & ((next_prefix == "I") | (next_prefix == "E"))
        & (next_kind == kind)
        & (prefix != "E")
        & (prefix != "S")
    )
    ends = inside & ~continues
    positions = tf.broadcast_to(tf.range(tf.shape(tag_ids)[1])[None], tf.shape(tag_ids))
    start = tf.ragged.boolean_mask(positions, starts).to_tensor(-1)
    end = tf.ragged.boolean_mask(positions + 1, ends).to_tensor(-1)
    span_type = tf.ragged.boolean_mask(kind, starts).to_tensor("")
    return tf.reduce_sum(tf.cast(starts, tf.int32), axis=1), start, end, span_type


def build_tagger_archive(head, encoder, elmo=None, tokenizer="whitespace", max_tokens=None):
    """`(archive, tag)`: a `keras.export.ExportArchive` with the `tag` endpoint (see the module docstring)
    and the Python function behind it (callable eagerly, for checks)."""
    if head.num_elmo_layers and elmo is None:
        raise ValueError("the tagger was trained with ELMo features: pass the ELMo model (--elmo)")
    tokenize = make_tokenizer(tokenizer, max_tokens)
    archive = keras.export.ExportArchive()
    archive.track(head)
    if head.num_elmo_layers:
        archive.track(elmo)
    table = None
    if head.word_vocab_size:
        table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant(encoder.words or [""], tf.string),
                tf.range(2, max(len(encoder.words), 1) + 2, dtype=tf.int32),
            ),
            default_value=1,
        )
        archive.track(table)
    labels = list(encoder.labels)

    def tag(sentences):
        tokens, lengths = tokenize(sentences)
        char_ids = tokens_to_char_ids(tokens)
        mask = tf.sequence_mask(lengths, tf.shape(tokens)[1])
        inputs = {"mask": mask}
        if head.num_elmo_layers:
            inputs["activations"] = tf.stack(elmo(char_ids, training=False)["activations"], axis=1)
        if table is not None:
            inputs["word_ids"] = tf.where(mask, table.lookup(tf.strings.lower(tokens, encoding="utf-8")), 0)
        if head.char_filters:
            inputs["char_ids"] = char_ids
        ids = head(inputs, training=False)
        num, start, end, span_type = spans_from_tags(ids, mask, labels)
        return {
            "tokens": tokens,
            "sequence_len": lengths,
            "tags": tf.where(mask, tf.gather(labels, ids), ""),
            "num_spans": num,
            "span_start": start,
            "span_end": end,
            "span_type": span_type,
        }

    archive.add_endpoint(SIGNATURE, tag, input_signature=[tf.TensorSpec([None], tf.string, name="sentences")])
    return archive, tag


def export_tagger(
    head,
    encoder,
    base_dir,
    elmo=None,
    version=None,
    tokenizer="whitespace",
    max_tokens=None,
    check_sentences=("EU rejects German call to boycott British lamb .", "", "Peter Blackburn"),
):
    """Writes `<base_dir>/<version>/` and checks the reloaded tags equal the Keras tagger's; returns the path."""

    def write(tmp):
        archive, tag = build_tagger_archive(head, encoder, elmo, tokenizer, max_tokens)
        archive.write_out(tmp, verbose=False)
        loaded = tf.saved_model.load(tmp)
        got = loaded.signatures[SIGNATURE](sentences=tf.constant(list(check_sentences)))
        want = tag(tf.constant(list(check_sentences)))
        for key in ("tags", "span_start", "span_end", "span_type", "num_spans"):
            if not np.array_equal(got[key].numpy(), want[key].numpy()):
                raise RuntimeError(f"the reloaded tagger's {key!r} differ from the Keras tagger's")

    return publish_version(base_dir, version, write)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ner", required=True, help="training/train_ner.py output dir (model.keras, encoder.json)")
    parser.add_argument(
        "--elmo",
        default=None,
        help="the biLM the tagger was trained on: dir or weights.hdf5 (default: what the NER dir's config.json names)",
    )
    parser.add_argument("--output", required=True, help="base dir, e.g. models/tagger")
    parser.add_argument("--version", type=int, default=None)
    parser.add_argument("--tokenizer", default="whitespace", choices=("whitespace", "unicode_script"))
    parser.add_argument("--max-tokens", type=int, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    from elmo_tf.io import load_elmo
    from elmo_tf.ner import Encoder

    for name in ("model.keras", "encoder.json"):
        if not os.path.isfile(os.path.join(args.ner, name)):
            parser.error(f"--ner: {args.ner!r} has no {name}")
    head = keras.saving.load_model(os.path.join(args.ner, "model.keras"))
    encoder = Encoder.load(os.path.join(args.ner, "encoder.json"))
    elmo = None
    if head.num_elmo_layers:
        source = args.elmo
        if source is None:
            with open(os.path.join(args.ner, "config.json")) as f:
                info = json.load(f).get("elmo_source", {})
            if info.get("kind") != "in_process":
                parser.error("--elmo: the tagger was trained on served features; name the biLM files (--elmo DIR)")
            source = info["weights"]
        folder = source if os.path.isdir(source) else os.path.dirname(source)
        weights = source if source.endswith(".hdf5") else os.path.join(folder, "weights.hdf5")
        try:
            elmo = load_elmo(os.path.join(folder, "options.json"), weights)
        except ValueError as e:
            parser.error(f"--elmo: {e}")
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
    except (FileExistsError, ValueError) as e:
        parser.error(f"--output/--version: {e}")
    logger.info("wrote %s (signature %r and serving_default)", path, SIGNATURE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
